"""``auto``: the service chooses the mechanism and its params (issue 16, item 1).

The rule table comes from the benchmark grid (``bench/experiments/bench_auto_grid.py``,
``bench/results/auto_grid.csv``, ``bench/results/auto_grid_v2_*.csv``; ``docs/mechanisms.md``,
section ``auto``):

- ``delta = 0``: ``smooth_sensitivity`` (Cauchy), the only pure mechanism.
- ``delta > 0``: ``analyze_gauss`` wins wherever the data is not within about 1e-3 of a
  k-dimensional subspace (relative to the row norms), and ``gap_perturbation`` and the
  Gaussian ``smooth_sensitivity`` never beat it (derivation in the docs), so neither is chosen.
  ``friendly_aggregate`` (with its own default aggregator) is 1-480x better than
  ``analyze_gauss`` when the rows are that close to a subspace, and worse beyond. Three regimes,
  chosen from public facts (``n``, ``d``, ``k``, ``epsilon``, ``delta``, ``C``, params):

  1. **Tail test** (``friendly_aggregate`` runs at ``(1 - s) eps - eps_w`` and the test is
     useful, e.g. ``eps = 1``, ``n = 50,000``): a private structure test with ``s =
     structure_share`` of epsilon picks ``analyze_gauss`` at ``((1 - s) eps, delta)`` or
     ``friendly_aggregate``'s guarded search (below) at ``B = (1 - s) eps``.
  2. **Staged aggregator** (the tail test is not useful, but an aggregator runs at the whole
     budget: ``friendly_aggregate`` when its own ``prepare`` accepts it, else
     ``histogram_aggregate``; e.g. ``eps = 1, n = 5,000`` and ``eps = 0.1, n = 50,000``): the
     aggregator's own private search (friendly: the radius search; histogram: the width search;
     both AboveThreshold with a quarter of the aggregator's budget, pure) is the structure
     test. Its partition, subset bases and search run exactly as in the aggregator's own run
     (same draws, same order), and from the released stop exponent and public facts auto either
     **continues** the aggregator (its remaining steps with its remaining budget) or **stops**
     and runs ``analyze_gauss`` with everything unspent and all of delta. A search that found
     nothing also stops. Continue iff the aggregator's predicted error at the found
     radius/width is below ``analyze_gauss``'s predicted error at 3/4 of the aggregator's
     budget (:func:`predicted_gauss_error`, :func:`predicted_friendly_error`,
     :func:`predicted_histogram_error`; calibrated on the grid, figures in the docs).
     ``friendly_aggregate`` runs as the guarded search (below) at ``B = eps``;
     ``histogram_aggregate`` (only where friendly is refused) at ``eps``, a stop leaving
     ``3 eps/4``.

  **Guarded search** (regimes 1 and 2, and 2b after a fine agreement; issue 24, item 5: no
  starved fallback). ``friendly_aggregate`` with its own radius search at ``B - eps_w``
  (``eps_w = RADIUS_TEST_SHARE eps``; :func:`guarded_search`): its search (``eps0 = (B -
  eps_w)/4``), then regime 2's continue-or-stop (stop: ``analyze_gauss`` at ``B - eps0``), then
  friendly's total weight at the found radius plus ``Lap(Delta_W/eps_w)``
  (:func:`noisy_total_weight`, pure) against the weight at which its test passes with
  probability 1/2 (:func:`search_weight_threshold`; a spurious stop has weight 0): below it
  ``analyze_gauss`` at ``B - eps0 - eps_w`` (``3/4`` of friendly's budget), else friendly's
  test and mean, and after a failed test ``analyze_gauss`` at the mean's unspent ``(eps2,
  delta2)``. So a friendly path that ends short of a result before its test leaves
  ``analyze_gauss`` at least 0.6 of epsilon (:func:`fallback_budgets`; regime 1: ``0.9 - 0.1 -
  0.2``), not the mean's 0.13-0.45; a check passes on weight 0 with probability at most 5%.
  Where friendly refuses ``B - eps_w``, its path is not taken: regime 1 is skipped (regime 2 or
  3 decides), regime 2 stages ``histogram_aggregate`` or none, and in 2b a fine agreement takes
  the (checked) given-radius path.
  2b. **Agreement test** (as 2, but friendly_aggregate's own radius search would stop
     spuriously on unstructured data with probability above ``SPURIOUS_STOP_LIMIT``, computed
     from public facts by :func:`spurious_stop_probability`: 0.51 at ``t = 166, eps = 1`` and
     ``t = 1666, eps = 0.1``, where a spurious stop ends in a failed test and the mean's quarter
     of the budget): a two-count test with ``eps_a = min(s, AGREEMENT_SHARE) eps`` (pure)
     counts the largest number of the ``t`` subsets' points ``y_j = P U_j U_j^T`` sharing a cell
     of a public coarse width ``w_c = AGREEMENT_WIDTH_FACTOR sqrt(d) r*`` and of a public fine
     width ``w_c/FINE_WIDTH_RATIO``, each plus ``Lap(2/eps_a)`` (sensitivity 1 each,
     :func:`noisy_agreement_counts`). Fine count at least ``t/2``: ``friendly_aggregate`` with
     its own radius search at ``(eps - eps_a, delta)``; else coarse count at least ``t/2``:
     ``friendly_aggregate`` with a public radius given (no search, so none of its spurious
     stops: at distance 1e-3 its radius search stops at a radius of weight ~0 in ~1/3 of runs
     and one radius too high in ~1/6), the narrow ``r*/2`` iff friendly's total weight at
     ``r*/2`` plus ``Lap(Delta_W/eps_w)`` (``eps_w = RADIUS_TEST_SHARE eps``, pure,
     :func:`noisy_total_weight`) reaches the weight its search needs
     (:func:`radius_test_threshold`), else the wide ``r*``, at ``(eps - eps_a - eps_w,
     delta)`` (``GIVEN_RADIUS_FACTORS``: the private scale at which the subsets agree picks
     the radius; no constant fits both agreement regimes); else ``analyze_gauss`` at ``(eps -
     eps_a, delta)``; a failed friendly test hands its unspent ``(eps2, delta2)`` to
     ``analyze_gauss``. After a fine agreement friendly runs as the guarded search at ``B = eps
     - eps_a``; the wide given-radius run gets ``eps - eps_a - 2 eps_w`` and its own noisy
     weight at ``r*`` first (below its test's need: ``analyze_gauss`` at ``eps - eps_a - 2
     eps_w``). Where friendly refuses ``eps - eps_a - eps_w`` with its search (``t = 100``:
     ``n = 5,000``, ``k = 5``), a fine agreement runs the given-radius path too.
  3. Otherwise ``analyze_gauss`` with the whole budget.

Structure test (regime 1): ``tail = sum_{i>k} lambda_i(H)`` of the clipped ``H = X^T X`` is the
smallest residual ``min_P sum_i ||(I - P) x_i||^2`` over rank-k projectors ``P``, and each term
lies in ``[0, C^2]``: replacing one row moves every ``P``'s objective by at most ``C^2``, hence the
minimum too; ``trace(H) = sum_i ||x_i||^2`` likewise. Each gets ``Lap(2 C^2/eps_s)`` with
``eps_s = structure_share * epsilon`` (``eps_s/2`` each: pure ``(eps_s, 0)``-DP). The ratio
``rho = tail_hat/trace_hat`` (post-processing) is the mean squared relative distance of the
rows to the best k-dim subspace; the aggregator is chosen iff ``rho < TAIL_RATIO_THRESHOLD``.

Privacy. Regime 1: sequential (adaptive) composition of the test ``(s eps, 0)`` and either
``analyze_gauss`` at ``((1 - s) eps, delta)`` or the guarded search with ``B = (1 - s) eps``.
The guarded search is the adaptive sequential composition of friendly's search ``(eps0, 0)``
(its partition and reference points are public randomness) and what its output selects:
``analyze_gauss`` at ``(B - eps0, delta)``, or the noisy weight ``(eps_w, 0)`` (friendly's own
total weight at the released radius, sensitivity ``Delta_W``, below) and then either
``analyze_gauss`` at ``(B - eps0 - eps_w, delta)`` or friendly's test ``(eps1, delta1)`` and its
mean ``(eps2, delta2)`` (or ``analyze_gauss`` at ``(eps2, delta2)`` in its place), with
``eps0 + eps1 + eps2 = B - eps_w``, ``delta1 + delta2 = delta``: every path totals ``(B,
delta)``. Regime 2: the guarded search with ``B = eps`` (histogram: its search ``(eps/4, 0)``
and the stability histogram ``(3 eps/4, delta)`` or ``analyze_gauss`` at ``(3 eps/4,
delta)``). Regime 2b: the agreement test ``(eps_a, 0)`` (two
counts of sensitivity 1 with ``Lap(2/eps_a)`` each: ``eps_a/2 + eps_a/2``; its partition,
reference points and offsets are public randomness) then the chosen mechanism at
``(eps - eps_a, delta)`` (friendly: the guarded search with ``B = eps - eps_a``; with
a given radius: the noisy total weight ``(eps_w, 0)`` then friendly's radius-given split
``eps1 + eps2 = eps - eps_a - eps_w``, ``delta1 + delta2 = delta``, and the fallback at its
``(eps2, delta2)``). The noisy weight is friendly's own statistic: on its public partition and
at a public radius the total weight has sensitivity ``Delta_W = 1 + (t - 1)/b`` (one replaced
row moves one subset's point: its own weight by at most 1, every other by at most ``1/b``), so
``W + Lap(Delta_W/eps_w)`` is ``(eps_w, 0)``-DP; the narrow run continues on the same
partition (public randomness), the wide one draws its own. Both radii are public functions of
public facts (``r*``: ``n, d, k, C``, the budget), fixed before the test runs; which friendly
run happens, and at which radius, is post-processing of the released counts and weight
(sequential, adaptive composition: every path totals ``eps_a + (eps - eps_a)`` or
``eps_a + eps_w + (eps - eps_a - eps_w)``; with the weight checks ``eps_a + eps0 + eps_w +
(eps - eps_a - eps0 - eps_w)`` after a search, ``eps_a + 2 eps_w + (eps - eps_a - 2 eps_w)``
for the wide run: each check is friendly's own total weight, sensitivity ``Delta_W``, pure).
The choice is post-processing of the released exponent
(or test result) and public facts. Every path totals exactly ``(eps, delta)``, declared and
charged before the run. Without a test (``structure_share = 0``, ``delta = 0``, or no
aggregator accepted from public facts) the chosen mechanism gets all of ``(eps, delta)``.
Released beside the chosen mechanism's own output: the choice, a reason, and in regime 2 the
search's exponent and the two predictions (public functions of it), in regime 2b whether the
test agreed and which radius was given, after a guarded search whether its weight check passed;
no noisy statistic of any test.

Profiles under the accountings (ALGORITHMS.md, "Accounting across releases"). Every test is a
pure ``eps_t``-DP step, ``eps_t^2/2``-zCDP (Bun & Steinke 2016, Proposition 1.4); each choice
declares its own steps (analyze_gauss Gaussian; friendly_aggregate and histogram_aggregate
pure searches, approximate tests with their stated events, Gaussian means; smooth_sensitivity's
Cauchy variant pure). Which path runs is decided inside the release from released outputs, so
the release is charged a bound that holds on every path (:meth:`Auto.privacy_steps`): zCDP
composes adaptively by summing ``rho`` and, for approximate zCDP, ``delta`` (Bun & Steinke,
Section 8, composition of approximate zCDP), and a step of ``rho' <= rho`` is also
``rho``-zCDP, so padding every path to the bound is sound. Under ``gaussian`` accounting a
pure test has no place in a GDP filter (no fully adaptive theorem for mixing is cited), so
there the structure share defaults to 0 and auto runs analyze_gauss with its own settings
(clip quantile, centring), all Gaussian steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import Field

from service.mechanisms.analyze_gauss import DEFAULT_PRIVATE_CENTRE_QUANTILE
from service.mechanisms.base import (
    ApproximateStep,
    GaussianStep,
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
    check_clip_scale,
    resolve_clip_norm,
)
from service.mechanisms.centring import CenterParams
from service.mechanisms.components import component
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigenvalues_desc,
    eigh_memory,
)
from service.mechanisms.noise import laplace

if TYPE_CHECKING:
    from service.mechanisms.friendly_aggregate import (
        AnySplit,
        FriendlyAggregate,
        FriendlyAggregateParams,
        FriendlySearch,
    )

#: Default share of epsilon spent on the structure test when it runs.
DEFAULT_STRUCTURE_SHARE = 0.1

#: The aggregator is chosen when the noisy tail ratio is below this. Measured (bench grid, k = 3):
#: friendly_aggregate beats analyze_gauss at relative distance <= 1e-3 (rho <= 1e-5) and loses
#: at 1e-1 (rho ~ 0.03); the threshold sits in between, at relative distance ~0.05, far enough
#: from both that the test's noise rarely flips the choice where it runs
#: (see :func:`structure_test_useful`).
TAIL_RATIO_THRESHOLD = 3e-3

#: The test runs only if its Laplace noise, relative to the largest possible trace ``n C^2``,
#: is at most this fraction of the threshold: below that its answer would be mostly noise.
MAX_TEST_NOISE_FRACTION = 0.25

#: Working-memory ceiling of an aggregator plan (bytes): above it auto falls back to the next
#: aggregator or to analyze_gauss rather than have the whole release refused by the memory gate.
AGGREGATOR_MEMORY_CAP = 2 * 1024**3

#: Share of epsilon of the aggregators' private searches (both spend ``eps/4``, pure): in the
#: staged regime a stop sends the remaining ``(1 - SEARCH_SHARE) eps`` and all of delta to
#: analyze_gauss.
SEARCH_SHARE = 0.25

#: analyze_gauss's error over its lower bound ``sigma sqrt(d) k/(n C^2)``, measured on the grid
#: (rows of norm uniform in [0.2, 0.9] C, k = 3): 2.74-3.11 in all 10 cells measured
#: (``bench/results/auto_grid_v2_base_*.csv``). Rows of norm ~C would make it ~3x smaller:
#: the prediction then favours the aggregator, whose own error does not depend on the norms.
GAUSS_ERROR_FACTOR = 3.0

#: friendly_aggregate's error at radius ``r`` is predicted as ``r (FRIENDLY_RADIUS_TERM +
#: sqrt(d) s)`` with ``s`` the mean's noise per unit radius on agreeing subsets
#: (:func:`~service.mechanisms.friendly_aggregate.agreeing_noise`): the subsets' spread plus the
#: noise matrix's spectral norm over the eigengap 1. Measured/predicted 0.51-1.31 (median 0.75)
#: over the 46 successful projection runs at distance <= 1e-3 of ``auto_grid_v2_base_*.csv``.
FRIENDLY_RADIUS_TERM = 0.5

#: Where friendly_aggregate's own radius search would stop spuriously (no subsets agreeing at
#: all) with probability above this (:func:`spurious_stop_probability`; 0.44 at t = 166,
#: eps = 1 and at t = 1666, eps = 0.1), the staged regime is replaced by the agreement test.
SPURIOUS_STOP_LIMIT = 0.1

#: Share of epsilon of the agreement test (at most ``structure_share``): its two counts get
#: half each.
AGREEMENT_SHARE = 0.05

#: The agreement test's (coarse) cell width is ``AGREEMENT_WIDTH_FACTOR sqrt(d) r*`` with ``r*``
#: the radius below which friendly_aggregate is predicted to beat analyze_gauss: points
#: ``y_j = P U_j U_j^T`` of subsets whose projectors are ``r`` apart differ by about ``r/sqrt(d)``
#: per coordinate (``q d`` coordinates, ``||P M||_F ~ sqrt(q) ||M||_F``). Measured on the grid
#: (2 seeds, d = 10..1000): at factor 8 the largest cell holds 1-10 of the t points at distance
#: 1e-1, 0.35-1.0 t at 1e-3 and all t at 1e-5; at factor 16, 0 at 1e-1 (d = 50), 0.80-1.0 t at
#: 1e-3 (v3; at 8 the test missed 3 of 9 seeds at d = 50, distance 1e-3, eps = 0.1, n = 50k;
#: with two counts at Lap(2/eps_a), factor 16 missed 3 of 20 seeds there, factor 32 1 of 20).
AGREEMENT_WIDTH_FACTOR = 32.0

#: The agreement test's fine cell width is the coarse width over this (``sqrt(d) r*/2``).
#: Measured (2 seeds, d = 10, 50, 300, n = 5k and 50k): at ``8 sqrt(d) r*/16 = sqrt(d) r*/2``
#: the largest cell holds 0.95-1.0 t at
#: distance 1e-5 (radius exponent 15-16) and 0.01-0.25 t at 1e-3 (exponent 10); half the
#: subsets share a cell there at about exponent 12.
FINE_WIDTH_RATIO = 64.0


#: After a coarse-only agreement (the subsets agree at the coarse width but not the fine one),
#: friendly_aggregate runs with a public radius given, ``f r*`` for ``f`` one of these
#: (narrow, wide; no search, so ``eps0 = 0`` and no spurious stop; its radius-given split puts
#: ``eps/2`` on the mean instead of ``eps/4``): the narrow one iff a noisy total weight at it
#: reaches what friendly's search needs (:func:`noisy_total_weight`), else the wide one.
#: Subsets agreeing within the radius pass its test and its error is about
#: ``pred_friendly(f r*)``; wider ones fail it and analyze_gauss gets the unspent
#: ``(eps2, delta2)``. No constant serves both agreement regimes: at distance 1e-3 the subsets
#: (30 rows each in both) agree within ~0.0024 while ``r*`` is 0.0059 at n = 50k, eps = 0.1
#: (given ``r*``: 1.66-1.94x the best) and 0.0037 at n = 5k, eps = 1 (given ``r*/2``: the test
#: fails, 1.6-1.8x); the weight at ``r*/2`` is 0.98-1.0 t there and 0.00-0.07 t here
#: (non-private, bench seeds).
GIVEN_RADIUS_FACTORS: tuple[float, float] = (0.5, 1.0)

#: Share of epsilon of that noisy total weight (sensitivity ``Delta_W ~ 3``, pure), spent only
#: after a coarse-only agreement (the given-radius run gets ``eps - eps_a - eps_w``): at
#: ``t = 1666, eps = 0.1`` its noise ``Lap(300)`` misses a weight of ``t`` against the bar
#: ``0.75 t`` with probability 0.12, and at ``t = 166, eps = 1`` (``Lap(30)``) passes a weight
#: of ``0.07 t`` with probability 0.01.
RADIUS_TEST_SHARE = 0.1

#: The agreement test chooses friendly_aggregate iff the noisy largest cell count reaches this
#: fraction of ``t``.
AGREEMENT_FRACTION = 0.5

#: histogram_aggregate's error at cell width ``w`` is predicted as ``w sqrt(d)/4`` (the cell
#: width dominates; its noise is in the choice of cell): measured/predicted median 0.8, 10-90%
#: 0.18-1.52 over 54 runs at distance <= 1e-3, d = 10..1000 (``auto_grid_v2_base_*.csv``).
HISTOGRAM_WIDTH_FACTOR = 0.25


class AutoParams(CenterParams):
    """Params of ``auto``: the clip norm, the centring (PCA semantics) and the share of epsilon
    for the structure test.

    With ``center`` other than ``"none"`` only the Gram mechanisms apply (the aggregators do not
    centre): ``analyze_gauss`` (``delta > 0``) or ``smooth_sensitivity`` (``delta = 0``), each
    with the same ``center`` and ``center_share``, and no structure test. ``analyze_gauss``
    then runs as its own default PCA request (issue 32, item 1): the clip at the private
    ``DEFAULT_PRIVATE_CENTRE_QUANTILE`` of the row norms and, with ``"private"``, the centring
    route chosen from its probe. The default ``"none"`` is deliberate: the subspace of
    ``X^T X``, as for every mechanism, and the only one the aggregators estimate; PCA users ask
    (``PrivatePCA`` sends ``"private"``), and the dry run says which was done.
    """

    structure_share: float = Field(
        default=DEFAULT_STRUCTURE_SHARE,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description=(
            "Share s of epsilon spent on a private structure test (noisy tail ratio of X^T X, "
            "pure DP) that decides between analyze_gauss and friendly_aggregate where it is "
            "informative (the chosen mechanism gets (1 - s) epsilon and all of delta); "
            "elsewhere the aggregator's own search or a subset agreement test costing "
            "min(s, 0.05) epsilon decides. 0 disables every private choice (analyze_gauss)."
        ),
    )


@dataclass(frozen=True)
class Choice:
    """One candidate: a registered mechanism, its resolved params, its budget."""

    name: str
    params: MechanismParams
    epsilon: float
    delta: float

    def spec(self, k: int) -> ReleaseSpec[Any]:
        """The release spec the chosen mechanism runs with."""
        return ReleaseSpec(k=k, epsilon=self.epsilon, delta=self.delta, params=self.params)


@dataclass(frozen=True)
class Plan:
    """What ``auto`` runs, from public facts only.

    Regime 1 (tail test): ``aggregator`` is set (friendly at ``(1 - s) eps - eps_w``), the test
    spends ``test_epsilon`` and picks ``aggregator`` (guarded: ``agreement_stop``,
    ``search_weight_stop``, ``ptr_fallback``) or ``default``. Regime 2 (staged): ``staged`` is
    the aggregator (friendly at ``eps - eps_w``, guarded; histogram at ``eps``), ``default``
    analyze_gauss with everything unspent after a stop, ``search_weight_stop`` after a low
    noisy weight, ``ptr_fallback`` at friendly's ``(eps2, delta2)`` after a failed test.
    Regime 3: only ``default``, with the whole budget. :func:`fallback_budgets` lists them.
    """

    default: Choice
    aggregator: Choice | None
    test_epsilon: float
    reason: str
    notes: list[str] = field(default_factory=list)
    staged: Choice | None = None
    ptr_fallback: Choice | None = None
    #: Agreement regime: the test's epsilon, ``t`` and width (``staged`` is then friendly at
    #: ``(1 - s) eps``, always continued; ``default`` analyze_gauss at ``(1 - s) eps``).
    agreement_epsilon: float = 0.0
    agreement_t: int = 0
    agreement_width: float = 0.0
    #: The fine width (public).
    agreement_fine_width: float = 0.0
    #: After a coarse-only agreement: friendly_aggregate with the narrow public radius
    #: ``r*/2`` given (no search) at ``eps - eps_a - eps_w``, the same with the wide one
    #: ``r*``, analyze_gauss at their unspent ``(eps2, delta2)``, and the epsilon ``eps_w`` of
    #: the noisy total weight that picks the radius.
    coarse: Choice | None = None
    coarse_fallback: Choice | None = None
    coarse_wide: Choice | None = None
    radius_test_epsilon: float = 0.0
    #: Agreement regime, after a fine agreement: analyze_gauss at the unspent ``3/4`` of
    #: friendly's ``(eps - eps_a)`` and all of delta, when friendly's own radius search stops
    #: where its predicted error is not below analyze_gauss's (as in regime 2).
    agreement_stop: Choice | None = None
    #: Agreement regime, after a fine agreement and a search that continues: the epsilon
    #: ``eps_w`` of a noisy total weight at the searched radius (0: no such check) and
    #: analyze_gauss at everything still unspent when it falls below what friendly's test needs
    #: (``staged`` then runs at ``eps - eps_a - eps_w``).
    search_weight_epsilon: float = 0.0
    search_weight_stop: Choice | None = None
    #: After a coarse-only agreement whose narrow weight fell short: the wide run
    #: (``coarse_wide``) then gets ``eps - eps_a - 2 eps_w`` and its own noisy total weight at
    #: ``r*`` (``radius_test_epsilon``) first; below its test's need analyze_gauss runs with
    #: that budget (``wide_weight_stop``); after its failed test, analyze_gauss at its unspent
    #: ``(eps2, delta2)`` (``coarse_wide_fallback``). ``None``: the wide run as before.
    wide_weight_stop: Choice | None = None
    coarse_wide_fallback: Choice | None = None
    #: Agreement regime where friendly refuses the budget left after a weight check: a fine
    #: agreement runs the given-radius path too (``staged`` is then never run).
    fine_radius_given: bool = False


def _registered(name: str) -> Mechanism[Any]:
    return component(name)


def _prepare(
    name: str, ctx: PublicContext, k: int, epsilon: float, delta: float, raw: dict[str, Any]
) -> Choice:
    mechanism = _registered(name)
    params = mechanism.prepare(ctx, k, epsilon, delta, mechanism.parse_params(raw))
    return Choice(name, params, epsilon, delta)


def structure_noise_scale(clip_norm: float, test_epsilon: float) -> float:
    """Laplace scale ``2 C^2/eps_s`` of the noisy tail and trace (sensitivity ``C^2`` each at
    ``eps_s/2``)."""
    return 2.0 * clip_norm**2 / test_epsilon


def structure_test_useful(n_rows: int, test_epsilon: float) -> bool:
    """Whether the test's noise, relative to the largest trace ``n C^2``, is small enough
    (``2/(eps_s n) <= MAX_TEST_NOISE_FRACTION * threshold``) for its answer to mean something."""
    return 2.0 / (test_epsilon * max(1, n_rows)) <= MAX_TEST_NOISE_FRACTION * TAIL_RATIO_THRESHOLD


def _within_memory(choice: Choice, ctx: PublicContext, k: int, notes: list[str]) -> bool:
    spec = choice.spec(k)
    if _registered(choice.name).memory_bytes(ctx, spec) > AGGREGATOR_MEMORY_CAP:
        notes.append(f"{choice.name} skipped: memory above the cap")
        return False
    return True


def _aggregator(
    ctx: PublicContext, k: int, epsilon: float, delta: float, notes: list[str]
) -> Choice | None:
    """``friendly_aggregate`` at ``(epsilon, delta)`` with its own default aggregator (the
    projection for ``d <= 1000``), else reference points, if its own ``prepare`` accepts it and
    it fits the memory cap; ``None`` if neither does."""
    for raw in ({}, {"aggregator": "reference_points"}):
        try:
            choice = _prepare("friendly_aggregate", ctx, k, epsilon, delta, raw)
        except InvalidParameter as refusal:
            note = f"friendly_aggregate refused at this budget: {refusal.message}"
            if note not in notes:  # both aggregators share most refusals (t, n)
                notes.append(note)
            continue
        if _within_memory(choice, ctx, k, notes):
            return choice
    return None


def _histogram(
    ctx: PublicContext, k: int, epsilon: float, delta: float, notes: list[str]
) -> Choice | None:
    """``histogram_aggregate`` with its defaults (searched width) at ``(epsilon, delta)``."""
    try:
        choice = _prepare("histogram_aggregate", ctx, k, epsilon, delta, {})
    except InvalidParameter as refusal:
        notes.append(f"histogram_aggregate refused at this budget: {refusal.message}")
        return None
    return choice if _within_memory(choice, ctx, k, notes) else None


@dataclass(frozen=True)
class GuardedSearch:
    """friendly_aggregate with its own radius search at ``B - eps_w`` and the analyze_gauss run
    of each of its ends short of a result (issue 24, item 5: no starved fallback).

    ``B`` is the budget friendly's path has in its regime, ``eps_w`` the noisy total weight's
    (pure). ``search_stop``: its search found no radius (or a radius where it is predicted to
    lose): ``B - eps0``. ``weight_stop``: the noisy total weight at the found radius is below
    what its test needs: ``B - eps0 - eps_w``. ``ptr_fallback``: its test failed anyway: the
    mean's unspent ``(eps2, delta2)`` (only when the weight check passed, so rarely)."""

    searched: Choice
    weight_epsilon: float
    search_stop: Choice
    weight_stop: Choice
    ptr_fallback: Choice


def guarded_search(
    ctx: PublicContext,
    k: int,
    budget: float,
    weight_epsilon: float,
    delta: float,
    friendly: Choice,
    gram_raw: dict[str, Any],
    notes: list[str],
) -> GuardedSearch | None:
    """:class:`GuardedSearch` for ``friendly``'s ``t`` and aggregator at ``budget``, or ``None``
    if friendly's ``prepare`` refuses ``budget - weight_epsilon`` (its path then is not taken:
    without the check a spurious stop would leave analyze_gauss the mean's sliver)."""
    from service.mechanisms.friendly_aggregate import release_split

    params: Any = friendly.params
    t = int(params.t)
    try:
        searched = _prepare(
            "friendly_aggregate",
            ctx,
            k,
            budget - weight_epsilon,
            delta,
            {"t": t, "aggregator": params.aggregator},
        )
    except InvalidParameter as refusal:
        notes.append(f"friendly_aggregate refused after a weight check: {refusal.message}")
        return None
    split = release_split(searched.epsilon, delta, False, t=t)
    return GuardedSearch(
        searched,
        weight_epsilon,
        _prepare("analyze_gauss", ctx, k, budget - split.eps0, delta, gram_raw),
        _prepare("analyze_gauss", ctx, k, searched.epsilon - split.eps0, delta, gram_raw),
        _prepare("analyze_gauss", ctx, k, *ptr_fallback_budget(split), gram_raw),
    )


def fallback_budgets(the_plan: Plan) -> dict[str, tuple[float, float]]:
    """The ``(epsilon, delta)`` analyze_gauss gets on each path of ``the_plan`` where a test
    chose friendly_aggregate and friendly then ends short of a result (a pure function of the
    plan, so the split is testable without running): ``search_stop`` (its search found no
    radius, or one where it is predicted to lose), ``weight_check`` (the noisy total weight
    before its test is too low), ``wide_weight_check`` (the same for the wide given-radius run),
    ``ptr_failed`` / ``radius_given_ptr_failed`` / ``radius_given_wide_ptr_failed`` (its test
    failed after the weight check passed: the mean's unspent share)."""
    paths = {
        "search_stop": the_plan.agreement_stop,
        "weight_check": the_plan.search_weight_stop,
        "wide_weight_check": the_plan.wide_weight_stop,
        "ptr_failed": the_plan.ptr_fallback,
        "radius_given_ptr_failed": the_plan.coarse_fallback,
        "radius_given_wide_ptr_failed": the_plan.coarse_wide_fallback,
    }
    if the_plan.staged is not None and the_plan.agreement_epsilon == 0:
        paths["search_stop"] = the_plan.default  # regime 2: a stop runs the default
    return {name: (c.epsilon, c.delta) for name, c in paths.items() if c is not None}


# ---------------------------------------------------------------------------------------------
# The staged regime's predictions (public functions of public facts and the released exponent)


def predicted_gauss_error(
    n: int, d: int, k: int, clip_norm: float, eps: float, delta: float
) -> float:
    """``GAUSS_ERROR_FACTOR sigma sqrt(d) k/(n C^2)``: analyze_gauss's noise ``E(sigma)`` has
    spectral norm about ``sigma sqrt(d)`` (times 2, semicircle), over the k-th eigenvalue, at
    most ``n C^2/k`` when the rows span k dimensions evenly; the factor is measured."""
    from service.mechanisms.analyze_gauss import noise_sigma

    sigma = noise_sigma(clip_norm, eps, delta)
    return GAUSS_ERROR_FACTOR * sigma * math.sqrt(d) * k / (max(1, n) * clip_norm**2)


def predicted_friendly_error(
    params: FriendlyAggregateParams, radius: float, d: int, k: int, eps: float, delta: float
) -> float:
    """``r (FRIENDLY_RADIUS_TERM + sqrt(d) s)`` (``r / sqrt(q)`` for reference points, whose
    ``q x d`` mean has singular values about ``sqrt(q)``), ``s`` the mean's noise per unit
    radius when every subset agrees at this ``t`` and budget split."""
    from service.mechanisms.friendly_aggregate import agreeing_noise, release_split

    assert params.t is not None
    noise = agreeing_noise(
        params.t, release_split(eps, delta, params.radius is not None, t=params.t)
    )
    scale = radius if params.aggregator == "projection" else radius / math.sqrt(params.q or 2 * k)
    return scale * (FRIENDLY_RADIUS_TERM + math.sqrt(d) * noise)


def predicted_histogram_error(width: float, d: int) -> float:
    """``HISTOGRAM_WIDTH_FACTOR w sqrt(d)``."""
    return HISTOGRAM_WIDTH_FACTOR * width * math.sqrt(d)


def spurious_stop_probability(
    threshold: float, sensitivity: float, epsilon: float, queries: int
) -> float:
    """Probability that AboveThreshold (threshold noise ``Lap(2 D/eps)``, query noise
    ``Lap(4 D/eps)``) stops on one of ``queries`` answers that are all 0: ``E_Y[1 - (1 -
    P(X >= T + Y))^m]``, by quadrature over the threshold noise ``Y`` (public facts only)."""
    b = 4.0 * sensitivity / epsilon
    y = np.linspace(-40.0 * b / 2, 40.0 * b / 2, 20_001)
    density = np.exp(-np.abs(y) / (b / 2)) / b
    level = threshold + y
    above = np.where(
        level > 0,
        0.5 * np.exp(-np.maximum(level, 0) / b),
        1 - 0.5 * np.exp(np.minimum(level, 0) / b),
    )
    stop = 1.0 - (1.0 - above) ** queries
    return float(np.clip(np.sum(stop * density) * (y[1] - y[0]), 0.0, 1.0))


def friendly_spurious_stop_probability(choice: Choice) -> float:
    """:func:`spurious_stop_probability` of friendly_aggregate's radius search for ``choice``."""
    from service.mechanisms.friendly_aggregate import (
        radius_steps,
        ramp_width,
        release_split,
        split_search_threshold,
        weight_sensitivity,
    )

    params: Any = choice.params
    t = params.t
    split = release_split(choice.epsilon, choice.delta, params.radius is not None, t=t)
    if params.radius is not None or split.eps0 <= 0:
        return 0.0
    bar = split_search_threshold(t, split)
    sens = weight_sensitivity(t, ramp_width(t))
    return spurious_stop_probability(bar, sens, split.eps0, radius_steps(params.aggregator) + 1)


def ptr_fallback_budget(split: AnySplit) -> tuple[float, float]:
    """The ``(epsilon, delta)`` analyze_gauss runs with when friendly_aggregate's test fails:
    the unspent mean step's.

    Basic split: ``(eps2, delta2)``, sequential composition. F3's split: the mean would have
    been ``mean_mu``-GDP (Gaussian noise ``D/mean_mu``); analyze_gauss is a Gaussian mechanism
    too (sensitivity ``sqrt(2) C^2``), and calibrated by the analytic Gaussian to ``(eps_f,
    delta_f)`` with ``delta_f`` at most ``delta_G(mean_mu, eps_f)`` (the exact profile of a
    ``mean_mu``-GDP Gaussian, which the analytic calibration inverts) its noise is at least
    ``sqrt(2) C^2/mean_mu``: it is ``mean_mu``-GDP, so it takes the mean's place in F3's exact
    composition, whose total stays within the request. ``eps_f`` is chosen so that
    ``delta_f = delta1`` (any choice on the profile is equally valid; this one reads like the
    basic split's ``delta2``), and ``delta_f`` is shaded down by ``1e-9`` relative, so that
    rounding can only enlarge the noise.
    """
    from service.mechanisms.composition import gaussian_profile
    from service.mechanisms.friendly_aggregate import GdpSplit

    if not isinstance(split, GdpSplit):
        return split.eps2, split.delta2
    target = split.delta1
    low, high = 0.0, 1.0
    while gaussian_profile(split.mean_mu, high) > target:
        low, high = high, 2.0 * high
    for _ in range(200):  # gaussian_profile decreases in eps
        mid = 0.5 * (low + high)
        if gaussian_profile(split.mean_mu, mid) > target:
            low = mid
        else:
            high = mid
    return high, gaussian_profile(split.mean_mu, high) * (1.0 - 1e-9)


def break_even_radius(
    friendly: Choice, n: int, d: int, k: int, clip_norm: float, gauss_epsilon: float
) -> float:
    """``r*``: the radius at which friendly's predicted error equals analyze_gauss's at
    ``gauss_epsilon`` (public)."""
    params: Any = friendly.params
    gauss = predicted_gauss_error(n, d, k, clip_norm, gauss_epsilon, friendly.delta)
    per_unit = predicted_friendly_error(params, 1.0, d, k, friendly.epsilon, friendly.delta)
    return gauss / per_unit


def agreement_width(
    friendly: Choice, n: int, d: int, k: int, clip_norm: float, gauss_epsilon: float
) -> float:
    """``AGREEMENT_WIDTH_FACTOR sqrt(d) r*`` (:func:`break_even_radius`; public)."""
    r_star = break_even_radius(friendly, n, d, k, clip_norm, gauss_epsilon)
    return AGREEMENT_WIDTH_FACTOR * math.sqrt(d) * r_star


def agreement_memory_bytes(n: int, d: int, k: int, t: int) -> int:
    """Peak bytes of :func:`noisy_agreement_count` (the model of ``histogram_aggregate``'s
    points and one width's query, ``q = 2k``)."""
    from service.mechanisms.sample_aggregate import (
        allowance,
        embeddings_bytes,
        subset_bases_bytes,
    )
    from service.mechanisms.width_selection import search_memory_bytes

    q, m = 2 * k, n // t
    partition = 8 * (2 * n + t * m)
    points = 8 * t * d * k + embeddings_bytes(t, q, d, k) + search_memory_bytes(t, q * d)
    return allowance(partition + max(subset_bases_bytes(t, m, d, k), points))


def noisy_agreement_counts(
    data: FloatArray,
    k: int,
    t: int,
    widths: tuple[float, ...],
    test_epsilon: float,
    rng: np.random.Generator,
) -> list[float]:
    """For each public width ``w`` of ``widths``: the largest cell count of the ``t`` subsets'
    points ``y_j = P U_j U_j^T`` (``q = 2k`` public reference points, public random partition)
    on a grid of width ``w`` with a public uniform offset, plus ``Lap(m/eps_a)``, ``m`` the
    number of widths.

    Replacing one row changes one subset, hence one point, hence every cell count by at most
    1 and the largest by at most 1 (``width_selection``'s argument; the point's cell is a
    function of the point alone): each count has sensitivity 1 and gets ``eps_a/m``, so the
    ``m`` of them are ``(eps_a, 0)``-DP (sequential composition).
    """
    from service.mechanisms.histogram_aggregate import histogram_points
    from service.mechanisms.width_selection import largest_cell_count

    points, _ = histogram_points(data, None, k, t, 2 * k, rng)
    noisy: list[float] = []
    for width in widths:
        offsets = np.asarray(rng.uniform(0.0, width, size=points.shape[1]), dtype=np.float64)
        count = largest_cell_count(points, width, offsets)
        noisy.append(float(count) + float(laplace(len(widths) / test_epsilon, rng)))
    return noisy


def noisy_agreement_count(
    data: FloatArray, k: int, t: int, width: float, test_epsilon: float, rng: np.random.Generator
) -> float:
    """:func:`noisy_agreement_counts` at one width: the count plus ``Lap(1/eps_a)``."""
    return noisy_agreement_counts(data, k, t, (width,), test_epsilon, rng)[0]


@dataclass(frozen=True)
class StagedDecision:
    """The staged regime's decision: post-processing of the search's output and public facts."""

    proceed: bool
    exponent: int | None
    predicted: float | None
    predicted_gauss: float
    reason: str

    def extras(self, mechanism: str) -> dict[str, Any]:
        return {
            "mechanism": mechanism,
            "exponent": self.exponent,
            "continued": self.proceed,
            "predicted_error": self.predicted,
            "predicted_analyze_gauss_error": self.predicted_gauss,
        }


def staged_decision(
    staged: Choice,
    ctx: PublicContext,
    k: int,
    clip_norm: float,
    exponent: int | None,
    scale: float | None,
) -> StagedDecision:
    """Continue the aggregator iff its search stopped (``exponent`` not ``None``) and its
    predicted error at the found radius or width ``scale`` is below analyze_gauss's predicted
    error at ``(1 - SEARCH_SHARE) eps``. A function of public facts and the release only."""
    d, eps, delta = ctx.n_cols, staged.epsilon, staged.delta
    gauss = predicted_gauss_error(ctx.n_rows, d, k, clip_norm, (1 - SEARCH_SHARE) * eps, delta)
    what = "radius" if staged.name == "friendly_aggregate" else "cell width"
    if exponent is None or scale is None:
        return StagedDecision(
            False,
            None,
            None,
            gauss,
            f"{staged.name}'s private {what} search found no {what} at which the subsets agree: "
            "analyze_gauss with the unspent rest of epsilon and all of delta",
        )
    if staged.name == "friendly_aggregate":
        params: Any = staged.params
        predicted = predicted_friendly_error(params, scale, d, k, eps, delta)
    else:
        predicted = predicted_histogram_error(scale, d)
    if predicted < gauss:
        return StagedDecision(
            True,
            exponent,
            predicted,
            gauss,
            f"{staged.name}'s private {what} search stopped at {what} {scale:.3g} (exponent "
            f"{exponent}): its predicted error {predicted:.3g} is below analyze_gauss's "
            f"{gauss:.3g}, so {staged.name} continues with its remaining budget",
        )
    return StagedDecision(
        False,
        exponent,
        predicted,
        gauss,
        f"{staged.name}'s private {what} search stopped at {what} {scale:.3g} (exponent "
        f"{exponent}): its predicted error {predicted:.3g} is not below analyze_gauss's "
        f"{gauss:.3g}, so analyze_gauss runs with the unspent rest of epsilon and all of delta",
    )


def plan(ctx: PublicContext, k: int, epsilon: float, delta: float, params: AutoParams) -> Plan:
    """The choice from public facts (raises :class:`InvalidParameter` like the chosen
    mechanism's ``prepare`` would). Deterministic: ``run`` recomputes it from the same facts."""
    clip = resolve_clip_norm(params.clip_norm, ctx)
    centre_raw: dict[str, Any] = {"clip_norm": clip}
    centred = params.center != "none"
    if centred:
        centre_raw.update(center=params.center, center_share=params.center_share)
    # analyze_gauss clips at a private quantile of the row norms (issue 24, item 3).
    gram_raw = {**centre_raw, "clip_quantile": DEFAULT_PRIVATE_CENTRE_QUANTILE}
    if delta == 0:
        choice = _prepare("smooth_sensitivity", ctx, k, epsilon, delta, centre_raw)
        reason = "delta = 0: smooth_sensitivity (Cauchy) is the only pure-DP mechanism"
        if centred:
            reason += "; " + centring_sentence(params, delta)
        return Plan(choice, None, 0.0, reason)
    if centred:
        choice = _prepare("analyze_gauss", ctx, k, epsilon, delta, gram_raw)
        return Plan(
            choice,
            None,
            0.0,
            f"{centring_sentence(params, delta)}; of the mechanisms that centre (the Gram "
            "mechanisms), analyze_gauss is the most accurate wherever it runs; the aggregators "
            "do not centre",
        )
    notes: list[str] = []
    share = params.structure_share
    if share > 0:
        main_epsilon = (1.0 - share) * epsilon
        weight_epsilon = RADIUS_TEST_SHARE * epsilon
        aggregator = _aggregator(ctx, k, main_epsilon, delta, notes)
        useful = structure_test_useful(ctx.n_rows, share * epsilon)
        guarded = (
            guarded_search(ctx, k, main_epsilon, weight_epsilon, delta, aggregator, gram_raw, notes)
            if aggregator is not None and useful
            else None
        )
        if guarded is not None:
            default = _prepare("analyze_gauss", ctx, k, main_epsilon, delta, gram_raw)
            return Plan(
                default,
                guarded.searched,
                share * epsilon,
                "friendly_aggregate can run: a private structure test (noisy tail ratio of "
                "X^T X) chooses it when the rows are within about 5% (relative) of a "
                "k-dimensional subspace, else analyze_gauss",
                notes,
                ptr_fallback=guarded.ptr_fallback,
                agreement_stop=guarded.search_stop,
                search_weight_epsilon=weight_epsilon,
                search_weight_stop=guarded.weight_stop,
            )
        if aggregator is not None and not useful:
            notes.append(
                "at this n and epsilon the tail-ratio test's noise would swamp its threshold"
            )
        staged = _aggregator(ctx, k, epsilon, delta, notes) or _histogram(
            ctx, k, epsilon, delta, notes
        )
        if (
            staged is not None
            and staged.name == "friendly_aggregate"
            and friendly_spurious_stop_probability(staged) > SPURIOUS_STOP_LIMIT
        ):
            agreement = _agreement_plan(ctx, k, epsilon, delta, clip, share, staged, notes)
            if agreement is not None:
                return agreement
        staged_guard: GuardedSearch | None = None
        if staged is not None and staged.name == "friendly_aggregate":
            # friendly's search at (eps - eps_w)/4, then a noisy total weight (eps_w) before
            # its test: a failed test would leave analyze_gauss only the mean's share
            staged_guard = guarded_search(
                ctx, k, epsilon, weight_epsilon, delta, staged, gram_raw, notes
            )
            staged = (
                staged_guard.searched
                if staged_guard is not None
                else _histogram(ctx, k, epsilon, delta, notes)
            )
        if staged is not None:
            if staged_guard is not None:
                default = staged_guard.search_stop
            else:
                rest = (1.0 - SEARCH_SHARE) * epsilon
                default = _prepare("analyze_gauss", ctx, k, rest, delta, gram_raw)
            return Plan(
                default,
                None,
                0.0,
                f"{staged.name} can run with the whole budget: its own private search "
                f"(epsilon/4) is the structure test; {staged.name} continues when its predicted "
                "error at the found scale is below analyze_gauss's, else analyze_gauss runs "
                "with the unspent rest of epsilon",
                notes,
                staged=staged,
                ptr_fallback=None if staged_guard is None else staged_guard.ptr_fallback,
                search_weight_epsilon=0.0 if staged_guard is None else weight_epsilon,
                search_weight_stop=None if staged_guard is None else staged_guard.weight_stop,
            )
    default = _prepare("analyze_gauss", ctx, k, epsilon, delta, gram_raw)
    why = (
        "; ".join(notes)
        if notes
        else "structure test disabled (structure_share = 0; the default on a gaussian dataset, "
        "whose Gaussian-DP filter cannot charge the tests' pure steps)"
    )
    return Plan(
        default,
        None,
        0.0,
        "analyze_gauss: no aggregator can run here, so the dependable default; " + why,
        notes,
    )


def centring_sentence(params: AutoParams, delta: float) -> str:
    """What auto's choice does about centring (issue 32, item 1: ``auto`` centres when asked
    for PCA), for the reason and the dry run; public facts only."""
    quantile = f"{DEFAULT_PRIVATE_CENTRE_QUANTILE:g}"
    if params.center == "none":
        return (
            'not centred (center "none", the default of every mechanism): the subspace of '
            "X^T X, the second-moment matrix, which the aggregators estimate too; for PCA send "
            'center "private" (PrivatePCA does by default), and auto then centres'
        )
    if delta == 0:
        if params.center == "private":
            return (
                "PCA requested: smooth_sensitivity centres on a private mean (Laplace noise, "
                "center_share of epsilon); it has no private clip quantile"
            )
        return "PCA requested: smooth_sensitivity centres on the given public centre (no budget)"
    if params.center == "private":
        return (
            'PCA requested (center "private"): analyze_gauss clips the rows at a private '
            f"{quantile}-quantile of their norms and chooses the centring route (the private "
            "mean, differences of publicly paired rows, or none) from a private probe, within "
            "the same budget"
        )
    return (
        "PCA requested (a public centre): analyze_gauss centres on it (no budget) and clips the "
        f"centred rows at a private {quantile}-quantile of their norms"
    )


def _agreement_plan(
    ctx: PublicContext,
    k: int,
    epsilon: float,
    delta: float,
    clip: float,
    share: float,
    staged: Choice,
    notes: list[str],
) -> Plan | None:
    """The agreement regime, or ``None`` if friendly_aggregate is refused at ``(1 - s) eps``."""
    from service.mechanisms.friendly_aggregate import release_split

    test_epsilon = min(share, AGREEMENT_SHARE) * epsilon
    rest = epsilon - test_epsilon
    friendly = _aggregator(ctx, k, rest, delta, notes)
    if friendly is None:
        return None
    params: Any = friendly.params
    t = int(params.t)
    if (ctx.n_rows // t) < k:
        return None
    spurious = friendly_spurious_stop_probability(staged)
    notes.append(
        f"friendly_aggregate's radius search would stop spuriously on unstructured data with "
        f"probability {spurious:.2f}: a two-count agreement test decides instead"
    )
    gram_raw = {"clip_norm": clip, "clip_quantile": DEFAULT_PRIVATE_CENTRE_QUANTILE}
    default = _prepare("analyze_gauss", ctx, k, rest, delta, gram_raw)
    r_star = break_even_radius(friendly, ctx.n_rows, ctx.n_cols, k, clip, rest)
    width = AGREEMENT_WIDTH_FACTOR * math.sqrt(ctx.n_cols) * r_star
    coarse: Choice | None = None
    coarse_wide: Choice | None = None
    coarse_fallback: Choice | None = None
    radius_epsilon = RADIUS_TEST_SHARE * epsilon
    given_rest = rest - radius_epsilon
    # After a fine agreement friendly's own search runs; where it stops spuriously (every
    # weight 0 at the found radius: the reason for this regime) its test would fail and leave
    # analyze_gauss only the mean's share (0.15-0.24 of epsilon). A noisy total weight at the
    # found radius (eps_w, pure, as after a coarse agreement) first checks that the test can
    # pass; below its bar analyze_gauss gets the unspent 3/4 of friendly's budget.
    guarded = guarded_search(ctx, k, rest, radius_epsilon, delta, friendly, gram_raw, notes)
    try:
        coarse, coarse_wide = (
            _prepare(
                "friendly_aggregate",
                ctx,
                k,
                given_rest,
                delta,
                {"radius": factor * r_star, "t": t, "aggregator": params.aggregator},
            )
            for factor in GIVEN_RADIUS_FACTORS
        )
    except InvalidParameter as refusal:
        coarse = coarse_wide = None
        notes.append(f"friendly_aggregate with a given radius refused: {refusal.message}")
    wide_weight_stop: Choice | None = None
    coarse_wide_fallback: Choice | None = None
    if coarse is not None:
        given = release_split(given_rest, delta, True, t=t)
        coarse_fallback = _prepare("analyze_gauss", ctx, k, *ptr_fallback_budget(given), gram_raw)
        # The wide run's test fails whenever the subsets do not agree within r* either (then
        # analyze_gauss got only the mean's 0.21-0.31 of epsilon): its own noisy weight at r*
        # decides first, as the narrow one's does.
        wide_rest = given_rest - radius_epsilon
        try:
            checked_wide = _prepare(
                "friendly_aggregate",
                ctx,
                k,
                wide_rest,
                delta,
                {"radius": r_star, "t": t, "aggregator": params.aggregator},
            )
        except InvalidParameter as refusal:
            notes.append(
                f"friendly_aggregate refused after a second weight check: {refusal.message}"
            )
        else:
            coarse_wide = checked_wide
            wide_weight_stop = _prepare("analyze_gauss", ctx, k, wide_rest, delta, gram_raw)
            wide_split = release_split(wide_rest, delta, True, t=t)
            coarse_wide_fallback = _prepare(
                "analyze_gauss", ctx, k, *ptr_fallback_budget(wide_split), gram_raw
            )
    # friendly's search is pure (eps0 = 1/4 of its budget, under either split); a stop leaves
    # everything but eps_a and eps0 unspent (the weight check runs only after a continue).
    # Where friendly refuses the budget left after a weight check, a fine agreement runs the
    # given-radius path (checked) instead of an unchecked search: never the mean's sliver.
    if guarded is None and coarse is None:
        notes.append("no friendly_aggregate run with a weight check: no agreement test")
        return None
    return Plan(
        default,
        None,
        0.0,
        f"friendly_aggregate can run, but its own radius search is unreliable here (spurious "
        f"stop probability {spurious:.2f}): a private agreement test (epsilon "
        f"{test_epsilon:.4g}, the noisy largest cell counts of the {t} subsets' points at a "
        "fine and a coarse public width) chooses friendly_aggregate when most subsets agree "
        "(at the fine width: with its own radius search; only at the coarse one: with a "
        "public radius given, r*/2 or r* as a noisy total weight at r*/2 says), else "
        "analyze_gauss",
        notes,
        staged=friendly if guarded is None else guarded.searched,
        ptr_fallback=None if guarded is None else guarded.ptr_fallback,
        agreement_epsilon=test_epsilon,
        agreement_t=t,
        agreement_width=width,
        agreement_fine_width=width / FINE_WIDTH_RATIO,
        coarse=coarse,
        coarse_fallback=coarse_fallback,
        coarse_wide=coarse_wide,
        radius_test_epsilon=radius_epsilon if coarse is not None else 0.0,
        agreement_stop=None if guarded is None else guarded.search_stop,
        search_weight_epsilon=0.0 if guarded is None else radius_epsilon,
        search_weight_stop=None if guarded is None else guarded.weight_stop,
        fine_radius_given=guarded is None,
        wide_weight_stop=wide_weight_stop,
        coarse_wide_fallback=coarse_wide_fallback,
    )


def agreement_decision(
    the_plan: Plan, fine: float, coarse: float
) -> tuple[Choice | None, dict[str, Any]]:
    """The agreement regime's choice from the two released noisy counts and the plan (public):
    friendly with its own search (fine count at least ``AGREEMENT_FRACTION t``, or the coarse
    one when no given-radius run was planned), friendly with the given radius (coarse count
    only), or ``None`` (analyze_gauss); and the released test outcome (no noisy count)."""
    bar = AGREEMENT_FRACTION * the_plan.agreement_t
    agreed_fine, agreed_coarse = fine >= bar, coarse >= bar
    chosen: Choice | None = None
    if the_plan.fine_radius_given and (agreed_fine or agreed_coarse):
        chosen = the_plan.coarse
    elif agreed_fine or (agreed_coarse and the_plan.coarse is None):
        chosen = the_plan.staged
    elif agreed_coarse:
        chosen = the_plan.coarse
    test: dict[str, Any] = {
        "test": "agreement",
        "epsilon": the_plan.agreement_epsilon,
        "width": the_plan.agreement_width,
        "fine_width": the_plan.agreement_fine_width,
        "t": the_plan.agreement_t,
        "threshold": bar,
        "agreed": chosen is not None,
        "agreed_fine": agreed_fine,
        "radius_given": chosen is not None and chosen is the_plan.coarse,
    }
    return chosen, test


def tail_and_trace(data: FloatArray, k: int, clip_norm: float) -> tuple[float, float]:
    """``(sum_{i>k} lambda_i, sum_i lambda_i)`` of the clipped ``X^T X`` (non-private).

    The tail is summed from the smallest eigenvalues (clamped at 0), not as trace minus the top
    k, so that it keeps its relative accuracy when it is tiny.
    """
    values = np.maximum(eigenvalues_desc(clipped_gram(data, clip_norm)), 0.0)
    return float(values[k:].sum()), float(values.sum())


def noisy_tail_and_trace(
    data: FloatArray, k: int, clip_norm: float, test_epsilon: float, rng: np.random.Generator
) -> tuple[float, float]:
    """``(tail + Lap(b), trace + Lap(b))``, ``b = 2 C^2/eps_s``: each has sensitivity ``C^2``
    and gets ``eps_s/2``, so the pair is ``(eps_s, 0)``-DP (see the module docstring)."""
    tail, trace = tail_and_trace(data, k, clip_norm)
    scale = structure_noise_scale(clip_norm, test_epsilon)
    return tail + float(laplace(scale, rng)), trace + float(laplace(scale, rng))


def structure_test(
    data: FloatArray, k: int, clip_norm: float, test_epsilon: float, rng: np.random.Generator
) -> bool:
    """``True`` (choose the aggregator) iff ``tail_hat/trace_hat < TAIL_RATIO_THRESHOLD``:
    post-processing of :func:`noisy_tail_and_trace`, so ``(eps_s, 0)``-DP."""
    tail_hat, trace_hat = noisy_tail_and_trace(data, k, clip_norm, test_epsilon, rng)
    # A trace below one noise scale says nothing about structure: keep the default.
    if trace_hat <= structure_noise_scale(clip_norm, test_epsilon):
        return False
    return tail_hat / trace_hat < TAIL_RATIO_THRESHOLD


class Auto(Mechanism[AutoParams]):
    name: ClassVar[str] = "auto"
    title: ClassVar[str] = "Automatic choice of mechanism (rule table from the benchmark grid)"
    paper: ClassVar[str] = (
        "Rule table from this service's benchmark grid (docs/mechanisms.md, 'auto'); the "
        "structure test follows seed 001's idea of a private low-rank test"
    )
    summary: ClassVar[str] = (
        "Chooses the mechanism from public facts (n, d, k, epsilon, delta, C) and, when an "
        "aggregator can run, a private structure test: a noisy tail ratio of X^T X "
        "(structure_share of epsilon), friendly_aggregate's own radius search (a quarter of "
        "epsilon, continued or handed to analyze_gauss), or a two-count subset agreement test "
        "(5% of epsilon) where that search is unreliable: friendly_aggregate (or "
        "histogram_aggregate) when the rows are very near a k-dim subspace, else "
        "analyze_gauss; smooth_sensitivity (Cauchy) when delta = 0; with center (PCA "
        "semantics) analyze_gauss with its default PCA settings (private clip quantile, "
        "centring route) or smooth_sensitivity centred alike. The result's extras and "
        "the dry run say what was chosen and why (auto_choice, auto_reason, auto_search)."
    )
    cost_rule: ClassVar[str] = (
        "Charges exactly the requested (epsilon, delta): the test or search and the chosen "
        "mechanism (the rest) compose sequentially. zcdp: the rho (and approximate delta) of "
        "its costliest path, tests included. gaussian: no tests by default (analyze_gauss "
        "with auto's settings, charged its mu); a request with structure_share is refused "
        "there."
    )
    params_model: ClassVar[type[AutoParams]] = AutoParams
    allows_pure_dp: ClassVar[bool] = True
    #: zcdp charges :meth:`privacy_steps` (its tests and choices, the worst path); gaussian
    #: admits the plans whose every step is Gaussian: :meth:`for_accounting` sets
    #: ``structure_share = 0`` there by default (the tests are pure steps), so auto runs
    #: analyze_gauss with its own settings and says so.
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "gaussian", "zcdp"})

    def for_accounting(self, accounting: str, params: AutoParams) -> AutoParams:
        """On a ``gaussian`` dataset the structure test is off unless the request sets its
        share (its tests are pure steps, which the Gaussian-DP filter cannot charge: a
        request that sets a share is then refused with 422, naming the accounting)."""
        if accounting != "gaussian" or "structure_share" in params.model_fields_set:
            return params
        return params.model_copy(update={"structure_share": 0.0})

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]
    ) -> list[PrivacyStep] | None:
        """Steps whose composition bounds every path of the plan :meth:`run` follows (the
        choice between paths is adaptive, inside the release: each path is padded to the
        bound, which is what is charged; ALGORITHMS.md, "Accounting across releases").

        A path is: some of its regime's pure tests (regime 1: the structure test and the
        weight check; regime 2: the weight check; 2b: the agreement test and either the weight
        check after a search or the two radius checks), then at most one aggregator's steps
        before its last one (friendly: search, test; histogram: search), then one terminal:
        that aggregator's last step (friendly's Gaussian mean, the stability histogram) or an
        analyze_gauss / smooth_sensitivity run. The bound is the largest test sum, plus the
        largest aggregator prefix, plus the largest terminal, in ``rho``; its ``delta`` the
        largest any one aggregator declares (analyze_gauss's steps are Gaussian, so a path's
        approximate delta is its aggregator's). ``None`` when a choice has no profile."""
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        aggregators: list[list[PrivacyStep]] = []
        terminals: list[list[PrivacyStep]] = []
        for choice, inner in self._specs(the_plan, spec.k):
            steps = _registered(choice.name).privacy_steps(ctx, inner)
            if steps is None:
                return None
            if choice.name in ("friendly_aggregate", "histogram_aggregate"):
                aggregators.append(steps)
            else:
                terminals.append(steps)
        tests = _worst_tests(the_plan)
        prefixes = [steps[:-1] for steps in aggregators]
        terminals += [steps[-1:] for steps in aggregators]
        prefix = max(prefixes, key=_rho_of, default=[])
        terminal = max(terminals, key=_rho_of)
        delta = max((_delta_of(steps) for steps in aggregators), default=0.0)
        bound = [_without_delta(step) for step in (*prefix, *terminal)]
        if delta > 0:
            bound.append(ApproximateStep(0.0, delta))
        return [*tests, *bound]

    def prepare(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: AutoParams
    ) -> AutoParams:
        self.check_common(ctx, k, epsilon, delta)
        clip = resolve_clip_norm(params.clip_norm, ctx)
        resolved = params.model_copy(update={"clip_norm": clip})
        the_plan = plan(ctx, k, epsilon, delta, resolved)
        if the_plan.aggregator is not None:
            # The test's magnitudes: tail and trace <= n C^2 (eigenvalues <= d n C^2), the
            # Laplace scale 2 C^2/eps_s and its draws (<= 64 scales).
            scale = 2.0 / the_plan.test_epsilon
            check_clip_scale(clip, min(1.0, scale), ctx.n_cols * ctx.n_rows + 64.0 * scale)
        return resolved

    def _specs(self, plan_: Plan, k: int) -> list[tuple[Choice, ReleaseSpec[Any]]]:
        choices = [plan_.default] + [
            c
            for c in (
                plan_.aggregator,
                plan_.staged,
                plan_.ptr_fallback,
                plan_.coarse,
                plan_.coarse_wide,
                plan_.coarse_fallback,
                plan_.agreement_stop,
                plan_.search_weight_stop,
                plan_.wide_weight_stop,
                plan_.coarse_wide_fallback,
            )
            if c is not None
        ]
        return [(c, c.spec(k)) for c in choices]

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]) -> Preview:
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        assert spec.params.clip_norm is not None  # resolved by prepare
        if the_plan.agreement_epsilon > 0 and the_plan.staged is not None:
            choice = f"{the_plan.staged.name} or {the_plan.default.name} (agreement test)"
        elif the_plan.staged is not None:
            choice = (
                f"{the_plan.staged.name} or {the_plan.default.name} "
                f"(decided by {the_plan.staged.name}'s private search)"
            )
        elif the_plan.aggregator is not None:
            choice = f"{the_plan.aggregator.name} or {the_plan.default.name} (structure test)"
        else:
            choice = the_plan.default.name
        summary, details = summarise_reason(choice, the_plan.reason)
        scales: dict[str, PreviewValue] = {
            "auto_choice": choice,
            "auto_reason": summary,
            "auto_details": " | ".join([*details, *the_plan.notes]),
            "structure_test": the_plan.aggregator is not None,
            "staged_search": the_plan.staged is not None and the_plan.agreement_epsilon == 0,
            "agreement_test": the_plan.agreement_epsilon > 0,
            "auto_centring": _centring_kind(spec.params),
            "auto_clip_quantile": _chosen_quantile(the_plan),
        }
        meaning = [f"auto chooses {summary}"]
        centring = centring_sentence(spec.params, spec.delta)
        if centring not in summary:
            meaning.append(centring[0].upper() + centring[1:] + ".")
        if the_plan.aggregator is not None:
            scale = structure_noise_scale(spec.params.clip_norm, the_plan.test_epsilon)
            scales.update(
                structure_epsilon=the_plan.test_epsilon,
                structure_noise_scale=scale,
                tail_ratio_threshold=TAIL_RATIO_THRESHOLD,
            )
            meaning.append(
                f"Structure test (epsilon {the_plan.test_epsilon:.4g}, pure): the tail "
                f"sum_(i>k) lambda_i and the trace of the clipped X^T X each get Laplace noise "
                f"of scale {scale:.4g}; friendly_aggregate runs if their ratio is below "
                f"{TAIL_RATIO_THRESHOLD:g} (epsilon {the_plan.aggregator.epsilon:.4g}: its "
                f"radius search, then a noisy total weight at the found radius, epsilon "
                f"{the_plan.search_weight_epsilon:.4g}, before its test; a stop or a weight "
                f"below its test's need runs analyze_gauss with everything unspent), else "
                f"analyze_gauss with epsilon {the_plan.default.epsilon:.4g}; all of delta."
            )
        if the_plan.agreement_epsilon > 0:
            bar = AGREEMENT_FRACTION * the_plan.agreement_t
            noise = 2.0 / the_plan.agreement_epsilon
            scales.update(
                agreement_epsilon=the_plan.agreement_epsilon,
                agreement_width=the_plan.agreement_width,
                agreement_fine_width=the_plan.agreement_fine_width,
                agreement_threshold=bar,
                agreement_noise_scale=noise,
            )
            given, wide, weight_bar, weight_noise = math.nan, math.nan, math.nan, math.nan
            if the_plan.coarse is not None and the_plan.coarse_wide is not None:
                from service.mechanisms.friendly_aggregate import ramp_width, weight_sensitivity

                given = float(getattr(the_plan.coarse.params, "radius", math.nan))
                wide = float(getattr(the_plan.coarse_wide.params, "radius", math.nan))
                weight_bar = radius_test_threshold(the_plan.coarse)
                t = the_plan.agreement_t
                weight_noise = weight_sensitivity(t, ramp_width(t)) / the_plan.radius_test_epsilon
                scales.update(
                    agreement_given_radius=given,
                    agreement_wide_radius=wide,
                    radius_test_epsilon=the_plan.radius_test_epsilon,
                    radius_test_threshold=weight_bar,
                    radius_test_noise_scale=weight_noise,
                )
            searched = the_plan.staged
            searched_epsilon = (searched or the_plan.default).epsilon
            meaning.append(
                f"Agreement test (epsilon {the_plan.agreement_epsilon:.4g}, pure): the rows are "
                f"split into {the_plan.agreement_t} random subsets; each subset's top-k "
                f"subspace maps {2 * spec.k} public Gaussian reference points to a point; the "
                f"largest numbers of points sharing a cell of the public fine width "
                f"{the_plan.agreement_fine_width:.4g} and coarse width "
                f"{the_plan.agreement_width:.4g} each get Laplace noise of scale {noise:.4g}; "
                f"friendly_aggregate runs if the fine count reaches {bar:.4g} (with its own "
                f"radius search, epsilon {searched_epsilon:.4g}"
                + (
                    f", then a noisy total weight at the found radius, epsilon "
                    f"{the_plan.search_weight_epsilon:.4g}, below the weight its test needs: "
                    "analyze_gauss with the rest"
                    if the_plan.search_weight_stop is not None
                    else ""
                )
                + ") or else the coarse one "
                f"does (with a public radius given, no search: {given:.4g} if its total "
                f"weight at that radius plus Laplace noise of scale {weight_noise:.4g}, epsilon "
                f"{the_plan.radius_test_epsilon:.4g}, reaches {weight_bar:.4g}, else "
                f"{wide:.4g}; epsilon {the_plan.default.epsilon - the_plan.radius_test_epsilon:.4g}"
                f"), else analyze_gauss with epsilon {the_plan.default.epsilon:.4g}; all of "
                "delta in each case."
            )
        elif the_plan.staged is not None:
            scales.update(self._staged_preview(ctx, spec, the_plan.staged, the_plan, meaning))
        for choice_, inner in self._specs(the_plan, spec.k):
            shown = _registered(choice_.name).preview(ctx, inner)
            # the fallback after a failed friendly test is analyze_gauss at a smaller budget:
            # its own prefix, so it does not overwrite the main candidate's scales
            prefixes = {
                id(the_plan.ptr_fallback): "ptr_fallback.",
                id(the_plan.coarse): "radius_given.",
                id(the_plan.coarse_wide): "radius_given_wide.",
                id(the_plan.coarse_fallback): "radius_given.ptr_fallback.",
                id(the_plan.agreement_stop): "search_stop.",
                id(the_plan.search_weight_stop): "weight_check_stop.",
                id(the_plan.wide_weight_stop): "radius_given_wide.weight_check_stop.",
                id(the_plan.coarse_wide_fallback): "radius_given_wide.ptr_fallback.",
            }
            label = prefixes.get(id(choice_), "") + choice_.name
            for key, value in shown.scales.items():
                scales[f"{label}.{key}"] = value
            meaning.extend(f"{label}: {line}" for line in shown.meaning)
        return Preview(scales=scales, meaning=meaning)

    @staticmethod
    def _staged_preview(
        ctx: PublicContext,
        spec: ReleaseSpec[AutoParams],
        staged: Choice,
        the_plan: Plan,
        meaning: list[str],
    ) -> dict[str, PreviewValue]:
        """The staged regime's public rule: the largest radius or width at which the aggregator
        continues (its prediction is linear in the scale)."""
        assert spec.params.clip_norm is not None
        d, k = ctx.n_cols, spec.k
        rest = the_plan.default.epsilon
        # as staged_decision: analyze_gauss's prediction at the aggregator's unsearched 3/4
        compared = (1 - SEARCH_SHARE) * staged.epsilon
        gauss = predicted_gauss_error(ctx.n_rows, d, k, spec.params.clip_norm, compared, spec.delta)
        if staged.name == "friendly_aggregate":
            params: Any = staged.params
            per_unit = predicted_friendly_error(params, 1.0, d, k, staged.epsilon, spec.delta)
            what = "radius"
        else:
            per_unit = predicted_histogram_error(1.0, d)
            what = "cell width"
        largest = gauss / per_unit
        weight_stop = the_plan.search_weight_stop
        meaning.append(
            f"{staged.name}'s private {what} search (epsilon "
            f"{staged.epsilon * SEARCH_SHARE:.4g}, pure) runs first; {staged.name} continues "
            f"with its remaining budget if the found {what} is below {largest:.4g} (predicted "
            f"error {per_unit:.4g} per unit {what} vs analyze_gauss's {gauss:.4g} at epsilon "
            f"{compared:.4g}), else analyze_gauss runs with epsilon {rest:.4g} and all of delta."
            + (
                ""
                if weight_stop is None
                else f" Before friendly_aggregate's test a noisy total weight at the found "
                f"radius (epsilon {the_plan.search_weight_epsilon:.4g}, pure) must reach "
                f"{search_weight_threshold(staged):.4g}, else analyze_gauss runs with epsilon "
                f"{weight_stop.epsilon:.4g} and all of delta."
            )
            + (
                ""
                if the_plan.ptr_fallback is None
                else f" If friendly_aggregate's test then fails, analyze_gauss runs with its "
                f"unspent epsilon {the_plan.ptr_fallback.epsilon:.4g} and delta "
                f"{the_plan.ptr_fallback.delta:.4g} instead of no result."
            )
        )
        return {
            "search_mechanism": staged.name,
            "search_epsilon": staged.epsilon * SEARCH_SHARE,
            "continue_below": largest,
            "predicted_analyze_gauss_error": gauss,
        }

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]) -> int:
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        d = ctx.n_cols
        # Staged regime: the aggregator's own model covers its search and its continuation; its
        # state is dropped before analyze_gauss runs, so the peak is the larger of the two.
        inner = max(
            _registered(c.name).memory_bytes(ctx, s) for c, s in self._specs(the_plan, spec.k)
        )
        if the_plan.agreement_epsilon > 0:
            # The agreement test's points are freed before the chosen mechanism runs.
            return max(inner, agreement_memory_bytes(ctx.n_rows, d, spec.k, the_plan.agreement_t))
        if the_plan.aggregator is None:
            return inner
        # The test's Gram matrix and its eigenvalues are freed before the chosen mechanism runs.
        return max(inner, clipped_gram_memory(ctx.n_rows, d), 8 * d * d + eigh_memory(d, d))

    def run(
        self, data: FloatArray, spec: ReleaseSpec[AutoParams], rng: np.random.Generator
    ) -> MechanismOutput:
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        n, d = data.shape
        # The plan is a function of public facts: the shape, the resolved clip norm, the request.
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=params.clip_norm)
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, params)
        if the_plan.agreement_epsilon > 0:
            return self._run_agreement(data, spec, the_plan, rng)
        if the_plan.staged is not None:
            return self._run_staged(data, spec, the_plan, rng)
        chosen, reason = the_plan.default, the_plan.reason
        if the_plan.aggregator is not None:
            if structure_test(data, spec.k, params.clip_norm, the_plan.test_epsilon, rng):
                reason = "the private structure test found the rows very near a k-dim subspace"
                return self._run_guarded_search(
                    data,
                    spec,
                    the_plan,
                    the_plan.aggregator,
                    the_plan.agreement_stop,
                    reason,
                    {"test": "structure"},
                    rng,
                )
            reason = "the private structure test found the rows not near a k-dim subspace"
        return _labelled(_run_choice(chosen, data, spec.k, rng), chosen, reason)

    def _run_agreement(
        self,
        data: FloatArray,
        spec: ReleaseSpec[AutoParams],
        the_plan: Plan,
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """Agreement regime: the two-count test ``(eps_a, 0)``, then friendly_aggregate at
        ``((1 - s) eps, delta)`` (its own radius search after a fine agreement, the given
        public radius after a coarse-only one; analyze_gauss at its unspent ``(eps2, delta2)``
        if its test fails) or analyze_gauss at ``((1 - s) eps, delta)``."""
        friendly = the_plan.staged
        assert friendly is not None
        fine, coarse = noisy_agreement_counts(
            data,
            spec.k,
            the_plan.agreement_t,
            (the_plan.agreement_fine_width, the_plan.agreement_width),
            the_plan.agreement_epsilon,
            rng,
        )
        chosen, test = agreement_decision(the_plan, fine, coarse)
        if chosen is None:
            reason = (
                "the private agreement test found fewer than half of the subsets' subspaces "
                "within the public cell widths: analyze_gauss"
            )
            out = _run_choice(the_plan.default, data, spec.k, rng)
            return _labelled(out, the_plan.default, reason, test)
        if chosen is friendly:
            return self._run_agreed_search(data, spec, the_plan, test, rng)
        else:
            output, chosen, narrow = _run_given_radius(the_plan, data, spec.k, rng)
            test = {**test, "radius_narrow": narrow}
            run = the_plan.coarse if narrow else the_plan.coarse_wide
            given = math.nan if run is None else getattr(run.params, "radius", math.nan)
            reason = (
                "the private agreement test found most of the subsets' subspaces within the "
                "coarse public cell width but not the fine one: friendly_aggregate with the "
                f"public radius {given:.4g} given (no search; the "
                f"{'narrow' if narrow else 'wide'} one, as the noisy total weight at the narrow "
                "one said)"
            )
            if chosen is the_plan.wide_weight_stop:
                test = {**test, "weight_check_passed": False}
                reason += (
                    "; the noisy total weight at the wide radius is below what its test needs, "
                    "so analyze_gauss runs with the budget of that run"
                )
                return _labelled(output, chosen, reason, test)
            fallback_ = the_plan.coarse_fallback
            if not narrow and the_plan.coarse_wide_fallback is not None:
                fallback_ = the_plan.coarse_wide_fallback
            if output.basis is not None or fallback_ is None:
                return _labelled(output, chosen, reason, test)
            return _after_failed_test(fallback_, data, spec.k, reason, test, rng)

    def _run_agreed_search(
        self,
        data: FloatArray,
        spec: ReleaseSpec[AutoParams],
        the_plan: Plan,
        test: dict[str, Any],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """After a fine agreement: :meth:`_run_guarded_search` of ``staged`` (a false agreement
        on data far from any subspace lets the search stop at a radius where every subset is
        everyone's friend, whose average is a random-level subspace)."""
        assert the_plan.staged is not None
        return self._run_guarded_search(
            data,
            spec,
            the_plan,
            the_plan.staged,
            the_plan.agreement_stop,
            "the private agreement test found most of the subsets' subspaces within the public "
            "cell width",
            test,
            rng,
        )

    def _run_guarded_search(
        self,
        data: FloatArray,
        spec: ReleaseSpec[AutoParams],
        the_plan: Plan,
        friendly: Choice,
        stop: Choice | None,
        reason: str,
        test: dict[str, Any],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """friendly_aggregate's own radius search at ``eps0 = B/4`` of its budget ``B``, then,
        as in regime 2, analyze_gauss with everything unspent (``stop``) when its predicted
        error at the found radius is not below analyze_gauss's; else the noisy total weight at
        that radius (``search_weight_epsilon``, pure) and, below what friendly's test needs,
        analyze_gauss with the unspent ``3 B/4`` (``search_weight_stop``); else friendly's own
        continuation (bit-identical to its run), and after its failed test analyze_gauss at
        its unspent ``(eps2, delta2)`` (``ptr_fallback``)."""
        assert stop is not None
        mechanism, inner, state, decision = _friendly_search(friendly, data, spec, rng)
        test = {**test, "searched": decision.extras(friendly.name)}
        reason = f"{reason}; {decision.reason}" if reason else decision.reason
        if not decision.proceed:
            del state
            out = _run_choice(stop, data, spec.k, rng)
            return _labelled(out, stop, reason, test)
        weight_stop = the_plan.search_weight_stop
        if weight_stop is not None:
            from service.mechanisms.friendly_aggregate import total_weight

            noisy = noisy_total_weight(
                total_weight(state.weights), state.t, the_plan.search_weight_epsilon, rng
            )
            passed = noisy >= search_weight_threshold(friendly)
            test = {**test, "weight_check_passed": passed}
            if not passed:
                del state
                reason += (
                    "; the noisy total weight at the searched radius is below what its test "
                    "needs, so analyze_gauss runs with the unspent 3/4 of its budget and all of "
                    "delta"
                )
                out = _run_choice(weight_stop, data, spec.k, rng)
                return _labelled(out, weight_stop, reason, test)
        output = mechanism.finish(state, inner, rng)
        del state
        if output.basis is not None or the_plan.ptr_fallback is None:
            return _labelled(output, friendly, reason, test)
        return _after_failed_test(the_plan.ptr_fallback, data, spec.k, reason, test, rng)

    def _run_staged(
        self,
        data: FloatArray,
        spec: ReleaseSpec[AutoParams],
        the_plan: Plan,
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """Regime 2: the aggregator's search, then its continuation or analyze_gauss."""
        staged = the_plan.staged
        assert staged is not None and spec.params.clip_norm is not None
        n, d = data.shape
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=spec.params.clip_norm)
        inner = staged.spec(spec.k)
        exponent: int | None
        scale: float | None
        if staged.name == "friendly_aggregate":
            out = self._run_guarded_search(
                data, spec, the_plan, staged, the_plan.default, "", {}, rng
            )
            # regime 2's search outcome is the released test itself (flat, as before)
            search = dict(out.extras.get("auto_search", {}))
            out.extras["auto_search"] = {**search.pop("searched", {}), **search}
            return out
        else:
            from service.mechanisms.histogram_aggregate import HistogramAggregate

            histogram = _registered(staged.name)
            assert isinstance(histogram, HistogramAggregate)
            h_state = histogram.search(data, inner, rng)
            exponent, scale = h_state.search.exponent, h_state.search.width
            decision = staged_decision(staged, ctx, spec.k, spec.params.clip_norm, exponent, scale)
            searched = decision.extras(staged.name)
            if decision.proceed:
                output = histogram.finish(h_state, inner, rng, n)
                return _labelled(output, staged, decision.reason, searched)
            del h_state
        output = _run_choice(the_plan.default, data, spec.k, rng)
        return _labelled(output, the_plan.default, decision.reason, searched)


def _centring_kind(params: AutoParams) -> str:
    """``"none"``, ``"private"`` or ``"public"`` (a given centre)."""
    return params.center if isinstance(params.center, str) else "public"


def _chosen_quantile(the_plan: Plan) -> float | None:
    """The clip quantile analyze_gauss runs with wherever the plan runs it (None when the
    default is smooth_sensitivity, at ``delta = 0``, which has none)."""
    quantile: float | None = getattr(the_plan.default.params, "quantile", None)
    return quantile


def _rho_of(steps: list[PrivacyStep]) -> float:
    """``sum rho`` of ``steps`` in doubles: only to pick the largest (the ledger sums the
    chosen steps exactly, rounded up)."""
    total = 0.0
    for step in steps:
        if isinstance(step, GaussianStep):
            total += (step.sensitivity / step.sigma) ** 2 / 2.0
        else:
            total += step.epsilon**2 / 2.0
    return total


def _delta_of(steps: list[PrivacyStep]) -> float:
    return sum(step.delta for step in steps if isinstance(step, ApproximateStep))


def _without_delta(step: PrivacyStep) -> PrivacyStep:
    """An approximate step's ``rho`` alone (its delta is counted once, as the path's)."""
    return PureStep(step.epsilon) if isinstance(step, ApproximateStep) else step


def _worst_tests(the_plan: Plan) -> list[PrivacyStep]:
    """The pure tests of the plan's costliest path (see :meth:`Auto.privacy_steps`)."""
    pure = [PureStep(the_plan.test_epsilon), PureStep(the_plan.agreement_epsilon)]
    after_search: list[PrivacyStep] = [PureStep(the_plan.search_weight_epsilon)]
    radius_checks: list[PrivacyStep] = [PureStep(the_plan.radius_test_epsilon)] * 2
    checks = max(after_search, radius_checks, key=_rho_of)
    return [step for step in (*pure, *checks) if isinstance(step, PureStep) and step.epsilon > 0]


def _friendly_search(
    friendly: Choice, data: FloatArray, spec: ReleaseSpec[AutoParams], rng: np.random.Generator
) -> tuple[FriendlyAggregate, ReleaseSpec[Any], FriendlySearch, StagedDecision]:
    """friendly_aggregate's own radius search for ``friendly`` (its first phase, drawing from
    ``rng`` as its run would) and regime 2's decision on the released radius."""
    from service.mechanisms.friendly_aggregate import FriendlyAggregate

    assert spec.params.clip_norm is not None  # resolved by prepare
    n, d = data.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=spec.params.clip_norm)
    mechanism = _registered(friendly.name)
    assert isinstance(mechanism, FriendlyAggregate)
    inner = friendly.spec(spec.k)
    state = mechanism.search(data, inner, rng)
    exponent = state.radius_exponent
    scale = None if exponent is None else state.radius
    decision = staged_decision(friendly, ctx, spec.k, spec.params.clip_norm, exponent, scale)
    return mechanism, inner, state, decision


def _after_failed_test(
    fallback: Choice,
    data: FloatArray,
    k: int,
    reason: str,
    test: dict[str, Any],
    rng: np.random.Generator,
) -> MechanismOutput:
    """analyze_gauss at the unspent ``(eps2, delta2)`` after a failed friendly test."""
    reason += (
        "; its propose-test-release check failed, so analyze_gauss ran with the unspent "
        "budget of its mean step"
    )
    out = _run_choice(fallback, data, k, rng)
    return _labelled(out, fallback, reason, {**test, "ptr_failed": True})


def noisy_total_weight(
    total: float, t: int, weight_epsilon: float, rng: np.random.Generator
) -> float:
    """``W + Lap(Delta_W/eps_w)``: friendly_aggregate's total weight at a public radius has
    sensitivity ``Delta_W = 1 + (t - 1)/b`` (its own bound: replacing one row changes one
    subset's point, its own weight by at most 1 and every other by at most ``1/b``), so this is
    ``(eps_w, 0)``-DP."""
    from service.mechanisms.friendly_aggregate import (
        ramp_width,
        weight_noise_scale,
        weight_sensitivity,
    )

    sens = weight_sensitivity(t, ramp_width(t))
    return total + float(laplace(weight_noise_scale(sens, weight_epsilon), rng))


def radius_test_threshold(narrow: Choice) -> float:
    """The bar of a noisy total weight before friendly's test (at the narrow given radius, or
    at the searched one): the weight friendly's own search needs to stop
    (:func:`~service.mechanisms.friendly_aggregate.split_search_threshold` of ``narrow``'s
    split: ``0.75 t`` where the test's own need is below it); public."""
    from service.mechanisms.friendly_aggregate import release_split, split_search_threshold

    params: Any = narrow.params
    split = release_split(narrow.epsilon, narrow.delta, params.radius is not None, t=params.t)
    return split_search_threshold(params.t, split)


def search_weight_threshold(searched: Choice) -> float:
    """The bar of the noisy total weight at friendly's searched (or given wide) radius: the
    weight at which its
    test passes with probability 1/2 (its floor plus its shift,
    :func:`~service.mechanisms.friendly_aggregate.split_shift`); below it the test more likely
    fails than passes, and a spurious stop (weight 0) is far below it. Public."""
    from service.mechanisms.friendly_aggregate import (
        ramp_width,
        release_split,
        split_shift,
        weight_floor,
        weight_sensitivity,
    )

    params: Any = searched.params
    given = params.radius is not None
    split = release_split(searched.epsilon, searched.delta, given, t=params.t)
    sens = weight_sensitivity(params.t, ramp_width(params.t))
    return weight_floor(sens) + split_shift(split, sens)


def _run_given_radius(
    the_plan: Plan, data: FloatArray, k: int, rng: np.random.Generator
) -> tuple[MechanismOutput, Choice, bool]:
    """After a coarse-only agreement: friendly_aggregate's partition, bases and weights at the
    narrow public radius, a noisy total weight ``(eps_w, 0)``, then its run at the narrow
    radius (continuing on the same partition) if that reaches :func:`radius_test_threshold`,
    else its run at the wide radius (a fresh partition: public randomness). Returns the
    output, the run's Choice and whether it was the narrow one."""
    from service.mechanisms.friendly_aggregate import FriendlyAggregate, total_weight

    narrow, wide = the_plan.coarse, the_plan.coarse_wide
    assert narrow is not None and wide is not None
    friendly = _registered(narrow.name)
    assert isinstance(friendly, FriendlyAggregate)
    inner = narrow.spec(k)
    state = friendly.search(data, inner, rng)
    noisy = noisy_total_weight(
        total_weight(state.weights), state.t, the_plan.radius_test_epsilon, rng
    )
    if noisy >= radius_test_threshold(narrow):
        return friendly.finish(state, inner, rng), narrow, True
    del state
    stop = the_plan.wide_weight_stop
    if stop is None:
        return _run_choice(wide, data, k, rng), wide, False
    # The wide run's own noisy total weight at r* (eps_w, pure, on its fresh partition) before
    # its test: below the weight at which that test passes with probability 1/2, analyze_gauss.
    inner = wide.spec(k)
    state = friendly.search(data, inner, rng)
    noisy = noisy_total_weight(
        total_weight(state.weights), state.t, the_plan.radius_test_epsilon, rng
    )
    if noisy >= search_weight_threshold(wide):
        return friendly.finish(state, inner, rng), wide, False
    del state
    return _run_choice(stop, data, k, rng), stop, False


def _run_choice(
    chosen: Choice, data: FloatArray, k: int, rng: np.random.Generator
) -> MechanismOutput:
    return _registered(chosen.name).run(data, chosen.spec(k), rng)


def _labelled(
    output: MechanismOutput,
    chosen: Choice,
    reason: str,
    search: dict[str, Any] | None = None,
) -> MechanismOutput:
    """The chosen mechanism's output with auto's choice, reason and (staged) search outcome."""
    summary, details = summarise_reason(chosen.name, reason)
    extras = {
        **output.extras,
        "auto_choice": chosen.name,
        "auto_reason": summary,
        "auto_details": details,
        "auto_params": chosen.params.model_dump(mode="json"),
        "auto_epsilon": chosen.epsilon,
        "auto_delta": chosen.delta,
    }
    if search is not None:
        extras["auto_search"] = search
    output.extras = extras
    return output


def summarise_reason(chosen: str, reason: str) -> tuple[str, list[str]]:
    """At most two plain sentences: what ran and the first reason, then the decisive last step
    when there was more than one; and every clause of the full reasoning (joined by ``"; "``
    where it is built) as a list for ``auto_details``."""
    clauses = [clause.strip() for clause in reason.split("; ") if clause.strip()]
    head = clauses[0] if clauses else "chosen from public facts"
    sentence = head if head.startswith(chosen) else f"{chosen}: {head}"
    summary = sentence.rstrip(".") + "."
    # The decisive step, when the reasoning ends in one ("..., so X ran/runs ...").
    if len(clauses) > 1 and ", so " in clauses[-1]:
        summary += " Then " + clauses[-1].rstrip(".") + "."
    return summary, clauses
