"""friendly_aggregate guarded by auto's Gram candidate (issue 24, item 5: no starved fallback), as
``auto`` runs it: friendly's budget on a path, the Gram candidate's (``analyze_gauss`` or, in
high dimension, ``spatial_sign``: :mod:`auto_gram`) after each of its ends short of a
result, the weight check between its search and its test, and the guarded run.

Privacy: the noisy total weight is friendly's own statistic on a public partition (its own, or
a fresh one for the check before the search) at a released or public radius (the found one, or
the break-even ``r*``, a function of auto's released estimate), sensitivity
``Delta_W = 1 + (t - 1)/b`` (one replaced row moves one subset's
point: its own weight by at most 1, every other by at most ``1/b``), so ``W + Lap(Delta_W/eps_w)``
is ``(eps_w, 0)``-DP; every choice below is post-processing of friendly's released radius, that
weight and its test, and each path's budgets sum to the path's (sequential composition; the
stops' budgets are exactly what friendly leaves unspent).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.auto_explain import labelled
from service.mechanisms.base import (
    InvalidParameter,
    MechanismOutput,
    MechanismParams,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.components import component
from service.mechanisms.friendly_aggregate import (
    FriendlyAggregate,
    agreeing_noise,
    radius_steps,
    ramp_width,
    release_split,
    split_search_threshold,
    split_shift,
    weight_floor,
    weight_noise_scale,
    weight_sensitivity,
)
from service.mechanisms.friendly_weights import total_weight
from service.mechanisms.linalg import FloatArray
from service.mechanisms.noise import laplace

#: Error rate of a check: a weight of 0 (a spurious stop) passes with at most this probability.
ALPHA = 0.05
#: Largest share of its budget the weight check may cost; above it the path is not offered.
MAX_WEIGHT_SHARE = 0.2
#: friendly_aggregate's error at radius ``r``: ``r (FRIENDLY_RADIUS_TERM + sqrt(d) s)``, ``s``
#: its mean's noise per unit radius; measured/predicted 0.51-1.31 (median 0.75) over 46 runs of
#: the v2 grid (``bench/results/auto_grid_v2_base_*.csv``).
FRIENDLY_RADIUS_TERM = 0.5
#: Working-memory ceiling of friendly's plan (bytes): above it the path is not offered.
AGGREGATOR_MEMORY_CAP = 2 * 1024**3


@dataclass(frozen=True)
class Choice:
    """One candidate: a registered mechanism, its resolved params, its budget."""

    name: str
    params: MechanismParams
    epsilon: float
    delta: float

    def spec(self, k: int) -> ReleaseSpec[Any]:
        return ReleaseSpec(k=k, epsilon=self.epsilon, delta=self.delta, params=self.params)


@dataclass(frozen=True)
class FriendlyPath:
    """friendly_aggregate (``run``) and the Gram candidate's budget after each of its ends short
    of a result: ``agreement_stop`` (a failed agreement check before the search: everything but
    that check's ``weight_epsilon``; ``None``: no such check), ``search_stop`` (everything but the
    search's ``eps0`` and a check before it), ``weight_stop`` (a failed weight check after the
    search: also less that check's ``weight_epsilon``; ``None``: no such check),
    ``ptr_fallback`` (its mean's unspent share after a failed test)."""

    run: Choice
    weight_epsilon: float
    search_stop: Choice
    weight_stop: Choice | None
    ptr_fallback: Choice
    agreement_stop: Choice | None = None

    def choices(self) -> list[Choice]:
        stops = (self.agreement_stop, self.search_stop, self.weight_stop, self.ptr_fallback)
        return [self.run, *(c for c in stops if c is not None)]

    @property
    def checks_epsilon(self) -> float:
        """The epsilon of every check on the path (0, one or two checks of ``weight_epsilon``)."""
        count = (self.agreement_stop is not None) + (self.weight_stop is not None)
        return count * self.weight_epsilon


def prepared(
    name: str, ctx: PublicContext, k: int, epsilon: float, delta: float, raw: dict[str, Any]
) -> Choice:
    mechanism = component(name)
    params = mechanism.prepare(ctx, k, epsilon, delta, mechanism.parse_params(raw))
    return Choice(name, params, epsilon, delta)


def friendly_path(
    ctx: PublicContext,
    k: int,
    budget: float,
    weight_epsilon: float,
    delta: float,
    gram: tuple[str, dict[str, Any]],
    notes: list[str],
    checks: tuple[bool, bool] = (False, True),
) -> FriendlyPath | None:
    """friendly_aggregate at ``budget`` less its checks (its default aggregator, else reference
    points) if its own ``prepare`` accepts it within the memory cap, with its stops: the Gram
    candidate ``gram`` (name, raw params) at each budget friendly leaves unspent. ``checks``:
    whether a check of ``weight_epsilon`` runs (before the search, after it); none when
    ``weight_epsilon`` is 0."""
    before, after = (c and weight_epsilon > 0 for c in checks)
    spent = weight_epsilon * (before + after)
    friendly = None
    for raw in ({}, {"aggregator": "reference_points"}):
        try:
            choice = prepared("friendly_aggregate", ctx, k, budget - spent, delta, raw)
        except InvalidParameter as refusal:
            note = f"friendly_aggregate refused at this budget: {refusal.message}"
            notes.extend([] if note in notes else [note])
            continue
        if component(choice.name).memory_bytes(ctx, choice.spec(k)) <= AGGREGATOR_MEMORY_CAP:
            friendly = choice
            break
        notes.append("friendly_aggregate skipped: memory above the cap")
    if friendly is None:
        return None
    eps0 = release_split(friendly.epsilon, delta, False, t=_t(friendly)).eps0
    first = budget - weight_epsilon * before  # after the check before the search (if any)
    name, raw = gram
    return FriendlyPath(
        friendly,
        weight_epsilon,
        prepared(name, ctx, k, first - eps0, delta, raw),
        prepared(name, ctx, k, budget - spent - eps0, delta, raw) if after else None,
        prepared(name, ctx, k, *ptr_fallback_budget(friendly), raw),
        prepared(name, ctx, k, first, delta, raw) if before else None,
    )


def weight_check_epsilon(friendly: Choice) -> float:
    """``Delta_W ln(1/(2 ALPHA))/bar``: the least epsilon at which a noisy total weight of 0 (a
    spurious stop) passes friendly's bar (:func:`search_weight_threshold`) with probability
    at most ``ALPHA`` (``P[Lap(b) >= bar] = exp(-bar/b)/2``)."""
    t = _t(friendly)
    bar = search_weight_threshold(friendly)
    sens = weight_sensitivity(t, ramp_width(t))
    return sens * math.log(1.0 / (2.0 * ALPHA)) / bar if bar > 0 else math.inf


def checked_path(
    ctx: PublicContext,
    k: int,
    budget: float,
    friendly: Choice,
    delta: float,
    gram: tuple[str, dict[str, Any]],
    notes: list[str],
) -> FriendlyPath | None:
    """friendly behind one weight check of epsilon :func:`weight_check_epsilon` of the run it
    guards. Where a spurious stop of its search is rare (:func:`spurious_stop_bound` at most
    ``ALPHA``) the check runs before the search, at the break-even radius: a failure then saves
    the search's ``eps0`` for the Gram candidate. Elsewhere it runs after the search, at the
    found radius: a spurious stop (weight ~0) would fail friendly's test and leave the Gram
    candidate only the mean's share, and this check is what keeps the fallback's floor (a
    second check before the search was measured to lose more than it saves there:
    docs/benchmarks.md, auto-cells). ``None`` above ``MAX_WEIGHT_SHARE`` of the budget or where
    friendly is then refused."""
    first = _checked(ctx, k, budget, friendly, delta, gram, notes, (True, False))
    if first is not None and spurious_stop_bound(first.run) <= ALPHA:
        return first
    after = _checked(ctx, k, budget, friendly, delta, gram, notes, (False, True))
    if after is None:
        notes.append("no weight check affordable: an unsure estimate runs the Gram candidate")
    return after


def _checked(
    ctx: PublicContext,
    k: int,
    budget: float,
    friendly: Choice,
    delta: float,
    gram: tuple[str, dict[str, Any]],
    notes: list[str],
    checks: tuple[bool, bool],
) -> FriendlyPath | None:
    """A fixed point: the checks' budget lowers friendly's, which raises the bar's noise share;
    a few rounds, each enlarging ``eps_w`` by 1%, settle it."""
    eps_w = weight_check_epsilon(friendly)
    for _ in range(8):
        if not sum(checks) * eps_w <= MAX_WEIGHT_SHARE * budget:
            return None
        path = friendly_path(ctx, k, budget, eps_w, delta, gram, notes, checks)
        if path is None:
            return None
        needed = weight_check_epsilon(path.run)
        if needed <= eps_w:
            return path
        eps_w = 1.01 * needed
    return None


def spurious_stop_bound(friendly: Choice) -> float:
    """Union bound on friendly's search stopping at a radius of weight 0: each of its grid's
    radii passes AboveThreshold's bar ``c`` with ``P[X - Y >= c] = (a^2 e^{-c/a} - b^2
    e^{-c/b})/(2(a^2 - b^2))``, ``X ~ Lap(a = 4 Delta_W/eps0)`` its query noise and ``Y ~ Lap(b
    = 2 Delta_W/eps0)`` the threshold's (the difference of two Laplace variables). Public."""
    params: Any = friendly.params
    t = int(params.t)
    split = release_split(friendly.epsilon, friendly.delta, False, t=t)
    if split.eps0 <= 0:
        return 0.0
    sens = weight_sensitivity(t, ramp_width(t))
    a, b = 4.0 * sens / split.eps0, 2.0 * sens / split.eps0
    c = split_search_threshold(t, split)
    tail = (a * a * math.exp(-c / a) - b * b * math.exp(-c / b)) / (2.0 * (a * a - b * b))
    return (radius_steps(params.aggregator) + 1) * tail


def ptr_fallback_budget(friendly: Choice) -> tuple[float, float]:
    """The Gram candidate's ``(epsilon, delta)`` after friendly's failed test: its unspent mean's.

    Basic split: ``(eps2, delta2)``. F3's GDP split: the mean would have been ``mean_mu``-GDP;
    a Gram candidate (``analyze_gauss`` or ``spatial_sign``: Gaussian steps at the largest
    ``mu`` with ``delta_G(mu, eps) <= delta``) calibrated to a point ``(eps_f, delta_f)`` of that
    Gaussian's exact profile (``delta_f = delta1``, shaded down ``1e-9`` relative so rounding
    only adds noise) is ``mean_mu``-GDP too, so it takes the mean's place in F3's composition.
    """
    from service.mechanisms.composition import gaussian_profile
    from service.mechanisms.friendly_aggregate import GdpSplit

    split = release_split(friendly.epsilon, friendly.delta, False, t=_t(friendly))
    if not isinstance(split, GdpSplit):
        return split.eps2, split.delta2
    low, high = 0.0, 1.0
    while gaussian_profile(split.mean_mu, high) > split.delta1:
        low, high = high, 2.0 * high
    for _ in range(200):  # gaussian_profile decreases in eps
        mid = 0.5 * (low + high)
        above = gaussian_profile(split.mean_mu, mid) > split.delta1
        low, high = (mid, high) if above else (low, mid)
    return high, gaussian_profile(split.mean_mu, high) * (1.0 - 1e-9)


def _t(friendly: Choice) -> int:
    params: Any = friendly.params
    return int(params.t)


def predicted_friendly_error(friendly: Choice, radius: float, d: int, k: int) -> float:
    """``r (FRIENDLY_RADIUS_TERM + sqrt(d) s)`` at radius ``r`` in friendly's own metric
    (``r/sqrt(q)`` for reference points, whose ``q x d`` points scale distances by
    ``sqrt(q)``), ``s`` its mean's noise per unit radius when every subset agrees."""
    params: Any = friendly.params
    split = release_split(friendly.epsilon, friendly.delta, params.radius is not None, t=params.t)
    noise = agreeing_noise(params.t, split)
    scale = radius if params.aggregator == "projection" else radius / math.sqrt(params.q or 2 * k)
    return scale * (FRIENDLY_RADIUS_TERM + math.sqrt(d) * noise)


def search_weight_threshold(friendly: Choice) -> float:
    """The weight at which friendly's test passes with probability 1/2 (its floor plus its
    shift); a spurious stop (weight 0) is far below it. Public."""
    params: Any = friendly.params
    split = release_split(friendly.epsilon, friendly.delta, params.radius is not None, t=params.t)
    sens = weight_sensitivity(params.t, ramp_width(params.t))
    return weight_floor(sens) + split_shift(split, sens)


def noisy_total_weight(
    total: float, t: int, weight_epsilon: float, rng: np.random.Generator
) -> float:
    """``W + Lap(Delta_W/eps_w)``: ``(eps_w, 0)``-DP (friendly's own sensitivity bound)."""
    sens = weight_sensitivity(t, ramp_width(t))
    return total + float(laplace(weight_noise_scale(sens, weight_epsilon), rng))


def break_even_radius(friendly: Choice, gram: float, d: int, k: int) -> float:
    """The radius ``r*`` in friendly's own metric at which its predicted error equals ``gram``
    (:func:`predicted_friendly_error` is linear in ``r``): friendly is predicted to win exactly
    when its subsets agree within ``r*``. Public given the released estimate."""
    unit = predicted_friendly_error(friendly, 1.0, d, k)
    return gram / unit if unit > 0 else math.inf


def agreement_weight(
    mechanism: FriendlyAggregate,
    data: FloatArray,
    friendly: Choice,
    k: int,
    radius: float,
    rng: np.random.Generator,
    person: PersonLevel | None,
) -> float:
    """friendly's total weight ``W(r*)`` on a fresh public partition at the given radius ``r*``
    (non-private: :func:`noisy_total_weight` releases it). A given radius spends nothing."""
    params: Any = friendly.params.model_copy(update={"radius": radius})
    spec = ReleaseSpec(k=k, epsilon=friendly.epsilon, delta=friendly.delta, params=params)
    if person is None:
        return total_weight(mechanism.search(data, spec, rng).weights)
    return total_weight(mechanism.search(data, spec, rng, person.units).weights)


def guarded_run(
    data: FloatArray,
    k: int,
    path: FriendlyPath,
    gauss: float,
    reason: str,
    test: dict[str, Any],
    rng: np.random.Generator,
    person: PersonLevel | None = None,
) -> MechanismOutput:
    """The agreement check first (if the path has one): friendly's noisy total weight at the
    break-even radius ``r*`` (:func:`break_even_radius` against ``gauss``, the Gram candidate's
    predicted error at the search stop's budget) must reach the weight its test needs; then
    friendly's radius search, its prediction at the released radius against ``gauss``, the
    weight check at that radius (if the path has one), its finish; each end short of a result
    runs the Gram candidate with everything unspent.
    ``person``: on a person-level dataset, friendly partitions people and every candidate runs
    per person (:class:`PersonLevel`)."""
    friendly, stop = path.run, path.search_stop
    mechanism = component(friendly.name)
    assert isinstance(mechanism, FriendlyAggregate)
    inner = friendly.spec(k)
    # Per person: friendly partitions people, each candidate runs per person (PersonLevel).
    runner = run_choice if person is None else person.run
    d = data.shape[1]
    if path.agreement_stop is not None:
        # One check decides whether a search is worth its eps0: the subsets' agreement at the
        # largest radius where friendly still wins. Without it an unresolved estimate pays
        # friendly's search (a quarter of its budget) before the Gram candidate runs.
        r_star = break_even_radius(friendly, gauss, d, k)
        total = agreement_weight(mechanism, data, friendly, k, r_star, rng, person)
        noisy = noisy_total_weight(total, _t(friendly), path.weight_epsilon, rng)
        test["break_even_radius"] = float(f"{r_star:.3g}")
        test["weight_check_passed"] = bool(noisy >= search_weight_threshold(friendly))
        if not test["weight_check_passed"]:
            reason += (
                f"; its subsets' noisy total weight at the radius {r_star:.3g}, where its "
                f"predicted error reaches {stop.name}'s {gauss:.3g}, is below what its test "
                f"needs (they do not agree where it could win), so "
                f"{stop.name} runs with everything but that check and all of delta"
            )
            out = runner(path.agreement_stop, data, k, rng)
            return labelled(out, path.agreement_stop, reason, {**test, "continued": False})
        reason += f"; its subsets' noisy total weight at the radius {r_star:.3g} passes its bar"
    if person is None:
        state = mechanism.search(data, inner, rng)
    else:
        state = mechanism.search(data, inner, rng, person.units)
    test["radius_exponent"] = state.radius_exponent
    if state.radius_exponent is None:
        reason += f"; its private radius search found no radius, so {stop.name} runs"
        return labelled(runner(stop, data, k, rng), stop, reason, {**test, "continued": False})
    predicted = predicted_friendly_error(friendly, state.radius, d, k)
    said = (
        f"its private radius search stopped at {state.radius:.3g}, where its predicted error "
        f"{predicted:.3g} is {'' if predicted < gauss else 'not '}below {stop.name}'s "
        f"{gauss:.3g}"
    )
    test["continued"] = bool(predicted < gauss)
    if not test["continued"]:
        reason += f"; {said}, so {stop.name} runs with the unspent rest and all of delta"
        return labelled(runner(stop, data, k, rng), stop, reason, test)
    reason += f"; {said}, so it continues"
    if path.weight_stop is not None:
        noisy = noisy_total_weight(total_weight(state.weights), state.t, path.weight_epsilon, rng)
        test["weight_check_passed"] = bool(noisy >= search_weight_threshold(friendly))
        if not test["weight_check_passed"]:
            del state
            reason += (
                "; the noisy total weight at that radius is below what its test needs, so "
                f"{stop.name} runs with the unspent rest and all of delta"
            )
            return labelled(runner(path.weight_stop, data, k, rng), path.weight_stop, reason, test)
    output = mechanism.finish(state, inner, rng)
    if output.basis is not None:
        return labelled(output, friendly, reason, test)
    reason += (
        f"; its propose-test-release check failed, so {stop.name} ran with the unspent "
        "budget of its mean step"
    )
    out = runner(path.ptr_fallback, data, k, rng)
    return labelled(out, path.ptr_fallback, reason, {**test, "ptr_failed": True})


def unsure_sentence(unsure: FriendlyPath, gram: str) -> str:
    """The dry run's account of the unsure path (friendly wins only at the optimistic end)."""
    bar = f"{search_weight_threshold(unsure.run):.4g}"
    eps_w = f"{unsure.weight_epsilon:.4g}"
    said = (
        f" unless friendly_aggregate wins at the optimistic end: then it runs with epsilon "
        f"{unsure.run.epsilon:.4g}"
    )
    if unsure.agreement_stop is not None:
        said += (
            f" if its noisy total weight (epsilon {eps_w}) at the radius where its predicted "
            f"error reaches {gram}'s reaches {bar} before its search, else {gram} with epsilon "
            f"{unsure.agreement_stop.epsilon:.4g}"
        )
    if unsure.weight_stop is not None:
        said += (
            f"; after its search a noisy total weight (epsilon {eps_w}) at the found radius must "
            f"reach {bar}, else {gram} with epsilon {unsure.weight_stop.epsilon:.4g}"
        )
    return said + "."


def run_choice(
    chosen: Choice, data: FloatArray, k: int, rng: np.random.Generator
) -> MechanismOutput:
    return component(chosen.name).run(data, chosen.spec(k), rng)


@dataclass(frozen=True)
class PersonLevel:
    """How ``auto`` runs on a dataset with ``privacy_unit_column`` (issue 34; built by
    :mod:`service.privacy_unit_auto`): ``units`` (the person of each row) partitions people in
    friendly's search, ``structure_rows`` gives the rows with each person's trace scaled to
    ``<= C^2`` (the estimate's sums then move by ``<= C^2`` per person, as per row), and ``run``
    runs a chosen candidate per person."""

    units: npt.NDArray[np.int64]
    structure_rows: Callable[[], FloatArray]
    run: Callable[[Choice, FloatArray, int, np.random.Generator], MechanismOutput]


def person_level_path(
    ctx: PublicContext, sure: FriendlyPath | None, notes: list[str]
) -> FriendlyPath | None:
    """On a person-level dataset (``ctx.n_units``, issue 34) friendly partitions people, so its
    ``t`` subsets need ``t <= n_units``: otherwise it is excluded, and the notes say why. Every
    other candidate is per person (analyze_gauss per-person bound and clip quantile, the
    estimate on each person's rows bounded to ``C^2``); smooth_sensitivity is refused before."""
    if ctx.n_units is None:
        return sure
    notes.append(
        f"privacy unit: person ({ctx.n_units} people): the estimate and both candidates bound "
        "each person (analyze_gauss per person, friendly_aggregate on a partition of people)"
    )
    if sure is not None and people_short(sure, ctx.n_units):
        notes.append(
            f"friendly_aggregate excluded: its t = {getattr(sure.run.params, 't', 0)} subsets "
            f"partition people and this dataset has {ctx.n_units}"
        )
        return None
    return sure


def people_short(path: FriendlyPath, n_units: int | None) -> bool:
    params: Any = path.run.params
    return n_units is not None and int(params.t) > n_units
