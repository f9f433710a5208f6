"""``auto``: the service chooses the mechanism, from one principle (issues 16, 32, 33).

**Principle.** Spend a stated share ``s`` of epsilon (``structure_share``, default 0.03, pure) on
a private estimate of what decides the choice, predict each candidate's error at the remaining
budget from first-order published bounds, and run the argmin; a private output the chosen
mechanism releases anyway (friendly_aggregate's radius) updates the prediction the same way.
Candidates: ``friendly_aggregate`` and one Gram candidate fixed by public facts
(:mod:`~service.mechanisms.auto_gram`): ``spatial_sign`` in high dimension (``d >= n^(2/3)``;
with a private centre, only at budgets where the centre's error stays below the Gram noise),
whose predicted error is never above analyze_gauss's there, else ``analyze_gauss`` with its
private 0.3 clip quantile.

*What decides* is how far the rows are from a k-dim subspace: the tail ``T = sum_{i>k} lambda_i``
of the clipped ``X^T X`` against its head ``S = trace - T``. Both predictions are ``sin Theta``
over the same gap ``g = lambda_k - lambda_{k+1}``, so ``g`` cancels where they are compared:

- the Gram candidate: ``e_G = sigma (sqrt(d - k) + sqrt(k)) f/g`` (first-order Davis-Kahan: the
  ``(d - k) x k`` block of its Gaussian noise, Davidson-Szarek), ``sigma`` its own noise at its
  budget and ``f = trace/(n C^2)`` the fill: its rows fill the norm that sets its noise (the sign
  map exactly, a quantile clip at best), which multiplies its gap by ``1/f``;
- ``friendly_aggregate`` (seed 001): a subset of ``n/t`` rows has the cross-term perturbation
  ``~ sqrt(T S/(n t))`` over the gap ``g/t``, so two subsets' projectors lie ``r = 2 sqrt(t T
  S/n)/g`` apart, and its error at radius ``r`` is ``r (FRIENDLY_RADIUS_TERM + sqrt(d) s_t)``
  with ``s_t`` its mean's published noise per unit radius.

**Rule.** ``T`` and the trace each get ``Lap(2 C^2/(s eps))``; friendly predicted to win at
the pessimistic end ``T_hat + b ln(1/(2 ALPHA))`` runs at ``(1 - s) eps`` (``sure``); predicted
to lose at the optimistic end, taken at :func:`skip_level` (a miss there skips the decisive
step below, so it is held to ``ALPHA`` times what the skip saves), the Gram candidate at ``(1 -
s) eps``. Only at the optimistic end (the sum cannot resolve rows 1e-2 from 1e-5 at ``n eps`` ~
6,000) the same prediction is made on each of friendly's ``t`` blocks and counted
(:mod:`~service.mechanisms.auto_count`: sensitivity 1, ``eps_c = 2 ln(1/(2 ALPHA))/t``, the
search's spurious stops priced in): friendly at ``(1 - s) eps - eps_c`` if most blocks predict
a win, else the Gram candidate at that budget; where the count is not offered, a weight check
(``unsure``, :mod:`~service.mechanisms.auto_guard`). Friendly's own radius search releases
``r``: if ``e_F(r)`` is not below ``e_G`` (``g ~ S/k``) the Gram candidate takes everything
unspent, as after a failed weight check or test. Public facts first
(:mod:`~service.mechanisms.auto_plan`): ``delta = 0``: ``smooth_sensitivity`` (Cauchy); a
centred (PCA) request: the Gram candidate with the request's centring (the aggregators do not
centre); friendly refused, ``s = 0``, or ``k = d`` (every rank-d basis spans the space): the
Gram candidate with everything (no estimate could change the choice, or the subspace).
``histogram_aggregate``, ``gap_perturbation`` and the Gaussian ``smooth_sensitivity`` never won
a grid cell where friendly runs.

*Constants.* ``ALPHA`` (5%) is the stated error rate; ``ln(1/(2 ALPHA))`` and the weight check's
epsilon follow from the Laplace tail; ``FRIENDLY_RADIUS_TERM`` was measured on the v2 grid
(``bench/results/auto_grid_v2_base_*.csv``) before this rule existed; ``n^(2/3)`` is the
literature's high-dimension boundary (issue 32), not fitted; the count's ``RADIUS_RATIO`` was
measured on rows off the grid (d = 100, 200); the bounds are derived, and checked
on planted rows in ``tests/mechanisms/test_auto_rule.py``. Figures:
``bench/bench_auto_cells.py`` (docs/benchmarks.md, issue 33).

**Privacy.** ``T`` is a minimum over projectors of sums of terms in ``[0, C^2]`` and the trace a
sum of such terms: each moves by at most ``C^2`` when a row is replaced, so the pair at ``s
eps/2`` each is ``(s eps, 0)``-DP; the block count moves by at most 1 (one block per row or
person, a partition drawn independently of the data): ``(eps_c, 0)``-DP. Every choice is
post-processing of released outputs (the estimate, the count, the radius, the noisy weight, the
test) and public facts; by sequential adaptive
composition every path totals exactly ``(eps, delta)`` (the check before the search reads
friendly's own weight statistic, sensitivity ``Delta_W``, on a fresh public partition at ``r*``,
a function of the released estimate) (each Gram candidate is Gaussian steps
at the largest ``mu`` its ``(eps, delta)`` allows, so it may take friendly's mean's place).
Under ``zcdp`` a pure ``eps``-DP step is ``eps^2/2``-zCDP (Bun & Steinke 2016, Prop. 1.4) and
the release is charged a bound covering every path (:meth:`Auto.privacy_steps`); under
``gaussian`` ``s = 0`` by default (:meth:`Auto.for_accounting`): the GDP filter cannot charge
the pure estimate.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from service.mechanisms import auto_explain
from service.mechanisms.auto_count import count_says_friendly, count_sentence
from service.mechanisms.auto_estimate import (
    Estimate,
    friendly_wins,
    predicted_error,
    predicted_gauss_error,
    tail_and_trace,
)
from service.mechanisms.auto_explain import centring_sentence, labelled, summarise_reason
from service.mechanisms.auto_gram import gram_sentence
from service.mechanisms.auto_guard import (
    ALPHA,
    FriendlyPath,
    PersonLevel,
    guarded_run,
    run_choice,
    unsure_sentence,
)
from service.mechanisms.auto_plan import DEFAULT_STRUCTURE_SHARE, AutoParams, Plan, plan
from service.mechanisms.base import (
    ApproximateStep,
    GaussianStep,
    Mechanism,
    MechanismOutput,
    Preview,
    PreviewValue,
    PrivacyStep,
    PublicContext,
    PureStep,
    ReleaseSpec,
    check_clip_scale,
    resolve_clip_norm,
)
from service.mechanisms.components import component
from service.mechanisms.linalg import FloatArray, clipped_gram_memory, eigh_memory
from service.mechanisms.noise import laplace

__all__ = [
    "DEFAULT_STRUCTURE_SHARE",
    "Auto",
    "AutoParams",
    "Estimate",
    "Plan",
    "centring_sentence",
    "friendly_wins",
    "plan",
    "predicted_error",
    "predicted_gauss_error",
    "summarise_reason",
    "tail_and_trace",
]

# ---------------------------------------------------------------------------------------------
# The estimate (its predictions: :mod:`~service.mechanisms.auto_estimate`)


def structure_noise_scale(clip_norm: float, test_epsilon: float) -> float:
    """``2 C^2/eps_s``: the Laplace scale of the noisy tail and trace (``C^2`` each at
    ``eps_s/2``)."""
    return 2.0 * clip_norm**2 / test_epsilon


def noisy_tail_and_trace(
    data: FloatArray, k: int, clip_norm: float, test_epsilon: float, rng: np.random.Generator
) -> tuple[float, float]:
    """``(T + Lap(b), trace + Lap(b))``, ``b = 2 C^2/eps_s``: ``(eps_s, 0)``-DP."""
    tail, trace = tail_and_trace(data, k, clip_norm)
    scale = structure_noise_scale(clip_norm, test_epsilon)
    return tail + float(laplace(scale, rng)), trace + float(laplace(scale, rng))


# ---------------------------------------------------------------------------------------------
# The decision


def skip_level(the_plan: Plan) -> float:
    """The level of the estimate's "friendly loses" verdict, which skips the optimistic end's
    decisive step (the block count, else the weight check): ``ALPHA eps_step/rest``. The skip
    saves the Gram candidate ``eps_step`` of its ``rest = (1 - s) eps`` (its error ~ 1/eps: a
    relative gain of about ``eps_step/rest``); a wrong skip, on rows friendly wins on, loses
    friendly's win, at least the Gram candidate's whole error where friendly wins by 2x or more
    (100-300x on rows near a subspace). So a skip may miss at most ``ALPHA`` times what it saves,
    and the misses of the verdict and of the step do not compound to twice ``ALPHA``."""
    counted = the_plan.counted
    path = the_plan.unsure if counted is None else counted.path
    step = path.checks_epsilon if counted is None and path is not None else 0.0
    step = counted.epsilon if counted is not None else step
    return ALPHA * min(step / the_plan.default.epsilon, 1.0) if step > 0 else ALPHA


def decide(the_plan: Plan, estimate: Estimate, n: int, d: int, k: int) -> FriendlyPath | None:
    """The first decision (post-processing of the estimate): friendly's ``sure`` path if it is
    predicted to win at the pessimistic tail (``1 - ALPHA``), the optimistic end's path (the
    count, else ``unsure``) if at the optimistic end at :func:`skip_level`, else ``None`` (the
    Gram candidate at ``(1 - s) eps``)."""
    unsure = the_plan.unsure if the_plan.counted is None else the_plan.counted.path
    optimistic = estimate.optimistic_tail(skip_level(the_plan))
    for path, tail in ((the_plan.sure, estimate.tail_high), (unsure, optimistic)):
        if path is not None and friendly_wins(path.run, the_plan.default, tail, estimate, n, d, k):
            return path
    return None


# ---------------------------------------------------------------------------------------------
# The mechanism


class Auto(Mechanism[AutoParams]):
    name: ClassVar[str] = "auto"
    title: ClassVar[str] = "Automatic choice of mechanism (predicted error from a private estimate)"
    paper: ClassVar[str] = (
        "This service's rule (docs/mechanisms.md, 'auto'): first-order Davis-Kahan bounds for "
        "analyze_gauss and for seed 001's subsets, on a private tail/trace estimate"
    )
    summary: ClassVar[str] = (
        "Spends structure_share of epsilon on a private estimate of how near the rows are to a "
        "k-dim subspace (noisy tail and trace of X^T X), predicts the Gram candidate's "
        "(analyze_gauss with its clip quantile; spatial_sign in high dimension, d >= n^(2/3)) "
        "and friendly_aggregate's errors at the rest of the budget and runs the smaller; "
        "friendly_aggregate's own radius search updates the prediction, and the Gram candidate "
        "gets everything unspent if friendly ends short; smooth_sensitivity (Cauchy) when "
        "delta = 0; with center (PCA) the Gram candidate with that centring. The extras and the "
        "dry run say what was chosen and why (auto_choice, auto_reason, auto_search)."
    )
    cost_rule: ClassVar[str] = (
        "Charges exactly the requested (epsilon, delta): the estimate, friendly's search and "
        "weight check, and the chosen mechanism compose sequentially. zcdp: the rho (and "
        "approximate delta) of a bound on every path. gaussian: no estimate by default "
        "(analyze_gauss with auto's settings); a request with structure_share is refused there "
        "unless k >= d (no estimate then: every rank-d basis spans the whole space)."
    )
    params_model: ClassVar[type[AutoParams]] = AutoParams
    allows_pure_dp: ClassVar[bool] = True
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "gaussian", "zcdp"})

    def for_accounting(self, accounting: str, params: AutoParams) -> AutoParams:
        """On a ``gaussian`` dataset the estimate is off unless the request sets its share (its
        steps are pure, which the Gaussian-DP filter cannot charge: such a request is refused
        with 422, naming the accounting; at k >= d no estimate runs, so it is accepted)."""
        if accounting != "gaussian" or "structure_share" in params.model_fields_set:
            return params
        return params.model_copy(update={"structure_share": 0.0})

    def prepare(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: AutoParams
    ) -> AutoParams:
        self.check_common(ctx, k, epsilon, delta)
        clip = resolve_clip_norm(params.clip_norm, ctx)
        resolved = params.model_copy(update={"clip_norm": clip})
        the_plan = plan(ctx, k, epsilon, delta, resolved)
        if the_plan.sure is not None:
            # tail and trace <= n C^2; the Laplace scale 2 C^2/eps_s and draws of <= 64 scales
            scale = 2.0 / the_plan.test_epsilon
            check_clip_scale(clip, min(1.0, scale), ctx.n_cols * ctx.n_rows + 64.0 * scale)
        return resolved

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]
    ) -> list[PrivacyStep] | None:
        """A bound on every path: the pure estimate and weight check, the larger of friendly's
        steps but its last (search, test), then the costliest terminal (friendly's mean or an
        analyze_gauss run), in ``rho``; the ``delta`` the largest any choice declares. Padding
        a path to the bound is sound (a ``rho' <= rho`` step is ``rho``-zCDP); zCDP composes
        adaptively (Bun & Steinke 2016, Section 8 for approximate zCDP)."""
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        runs = {id(p.run) for p in the_plan.paths()}
        prefixes: list[list[PrivacyStep]] = [[]]
        terminals: list[list[PrivacyStep]] = []
        delta = 0.0
        for choice in the_plan.choices():
            steps = component(choice.name).privacy_steps(ctx, choice.spec(spec.k))
            if steps is None:
                return None
            delta = max(delta, sum(s.delta for s in steps if isinstance(s, ApproximateStep)))
            if id(choice) in runs:
                prefixes.append(steps[:-1])
                steps = steps[-1:]
            terminals.append(steps)
        tests = [
            the_plan.test_epsilon,
            max((p.checks_epsilon for p in the_plan.paths()), default=0),
        ]
        if the_plan.counted is not None:  # the count and a path's checks never both run
            tests[1] = max(tests[1], the_plan.counted.epsilon)
        chosen = (*max(prefixes, key=_rho_of), *max(terminals, key=_rho_of))
        extra = [ApproximateStep(0.0, delta)] if delta > 0 else []
        return [*(PureStep(e) for e in tests if e > 0), *map(_without_delta, chosen), *extra]

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]) -> Preview:
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        default, sure, unsure = the_plan.default, the_plan.sure, the_plan.unsure
        choice = default.name if sure is None else f"{sure.run.name} or {default.name}"
        choice += "" if sure is None else " (structure test)"
        summary, details = summarise_reason(choice, the_plan.reason)
        quantile: float | None = getattr(default.params, "quantile", None)
        kind = spec.params.center if isinstance(spec.params.center, str) else "public"
        scales: dict[str, PreviewValue] = {
            "auto_choice": choice,
            "auto_reason": summary,
            # A note the reason already carries (split at its "; ") is not said twice.
            "auto_details": " | ".join(
                [*details, *(note for note in the_plan.notes if note not in the_plan.reason)]
            ),
            "structure_test": sure is not None,
            "auto_centring": kind,
            "auto_clip_quantile": quantile,
        }
        meaning = [f"auto chooses {summary}"]
        meaning += auto_explain.choice_notes(ctx, spec, default.name, summary, scales)
        if sure is not None:
            scale = structure_noise_scale(float(spec.params.clip_norm or 1), the_plan.test_epsilon)
            scales.update(
                structure_epsilon=the_plan.test_epsilon,
                structure_noise_scale=scale,
                structure_alpha=ALPHA,
            )
            meaning.append(
                f"Estimate (epsilon {the_plan.test_epsilon:.4g}, pure): the tail sum_(i>k) "
                f"lambda_i and the trace of the clipped X^T X each get Laplace noise of scale "
                f"{scale:.4g}; from them auto predicts friendly_aggregate's error (its subsets' "
                f"spread) and {default.name}'s (its noise over the gap). friendly_aggregate runs "
                f"with epsilon {sure.run.epsilon:.4g} if it wins at the tail's pessimistic "
                f"{1 - ALPHA:.0%} end; else {default.name} with epsilon {default.epsilon:.4g}"
                + (
                    count_sentence(the_plan.counted, default.name)
                    if the_plan.counted is not None
                    else "."
                    if unsure is None
                    else unsure_sentence(unsure, default.name)
                )
            )
            meaning.append(
                f"friendly_aggregate's radius search runs first; {default.name} takes everything "
                "unspent (all of delta) if the found radius predicts a larger error than "
                f"{default.name}'s, or if friendly's test fails (its mean's share)."
            )
        labels = {id(default): ""}
        counted = None if the_plan.counted is None else the_plan.counted.path
        if the_plan.counted is not None:
            labels[id(the_plan.counted.default)] = "count_stop."
        for name, path in (("", sure), ("unsure.", unsure), ("counted.", counted)):
            if path is not None:
                labels[id(path.run)] = name
                labels[id(path.search_stop)] = name + "search_stop."
                labels[id(path.weight_stop)] = name + "weight_check_stop."
                labels[id(path.agreement_stop)] = name + "agreement_check_stop."
                labels[id(path.ptr_fallback)] = name + "ptr_fallback."
        for c in the_plan.choices():
            shown = component(c.name).preview(ctx, c.spec(spec.k))
            label = labels.get(id(c), "") + c.name
            scales.update({f"{label}.{key}": value for key, value in shown.scales.items()})
            meaning.extend(f"{label}: {line}" for line in shown.meaning)
        return Preview(scales=scales, meaning=meaning)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]) -> int:
        """The largest choice's; the estimate's Gram and eigenvalues are freed before it."""
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        inner = max(component(c.name).memory_bytes(ctx, c.spec(spec.k)) for c in the_plan.choices())
        if the_plan.sure is None:
            return inner
        d = ctx.n_cols
        return max(inner, clipped_gram_memory(ctx.n_rows, d), 8 * d * d + eigh_memory(d, d))

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[AutoParams],
        rng: np.random.Generator,
        person: PersonLevel | None = None,
    ) -> MechanismOutput:
        """The plan's choice; ``person`` on a person-level dataset (issue 34): the estimate on
        each person's bounded rows, every candidate run per person (:class:`PersonLevel`). The
        reason states the clip analyze_gauss's quantile released
        (:func:`~service.mechanisms.auto_explain.with_clip`)."""
        out = self._choose_and_run(data, spec, rng, person)
        n = data.shape[0] if person is None else int(person.units.max(initial=-1)) + 1
        return auto_explain.with_clip(out, n)

    def _choose_and_run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[AutoParams],
        rng: np.random.Generator,
        person: PersonLevel | None,
    ) -> MechanismOutput:
        clip = spec.params.clip_norm
        assert clip is not None  # resolved by prepare
        n, d = data.shape
        n_units = None if person is None else int(person.units.max(initial=-1)) + 1
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=clip, n_units=n_units)
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        default = the_plan.default
        runner = run_choice if person is None else person.run
        if the_plan.sure is None:
            return labelled(runner(default, data, spec.k, rng), default, the_plan.reason)
        rows = data if person is None else person.structure_rows()
        tail_hat, trace_hat = noisy_tail_and_trace(rows, spec.k, clip, the_plan.test_epsilon, rng)
        del rows
        scale = structure_noise_scale(clip, the_plan.test_epsilon)
        estimate = Estimate.of(tail_hat, trace_hat, spec.k, scale, n * clip**2)
        path = decide(the_plan, estimate, n, d, spec.k)
        test: dict[str, Any] = {"test": "structure", "epsilon": the_plan.test_epsilon}
        if path is None:
            reason = (
                "the private estimate puts the rows too far from a k-dim subspace: "
                f"friendly_aggregate's predicted error is above {default.name}'s even at the "
                f"estimate's optimistic end; "
                + gram_sentence(default.name, n, d, person is not None)
            )
            out = runner(default, data, spec.k, rng)
            return labelled(out, default, reason, {**test, "friendly_predicted": "loses"})
        sure = path is the_plan.sure
        test["friendly_predicted"] = "wins" if sure else "may win"
        counted = the_plan.counted
        if counted is not None and path is counted.path:
            errors = (
                predicted_error(counted.default, estimate, d, spec.k),
                predicted_error(counted.path.ptr_fallback, estimate, d, spec.k),
            )
            units = None if person is None else person.units
            wins, shown = count_says_friendly(data, spec.k, counted, errors, clip, rng, units)
            test.update(shown, count_passed=wins)
            if not wins:
                reason = (
                    "the private estimate cannot tell whether the rows are near enough a k-dim "
                    "subspace for friendly_aggregate to win; most of the blocks' own tails "
                    f"(a noisy count) predict it loses, so {counted.default.name} runs"
                )
                out = runner(counted.default, data, spec.k, rng)
                return labelled(out, counted.default, reason, test)
        reason = (
            "the private estimate puts the rows near enough a k-dim subspace for "
            f"friendly_aggregate to win{'' if sure else ' at its optimistic end'}"
            + ("" if "count_passed" not in test else ", and most blocks' own tails agree")
        )
        gram = predicted_error(path.search_stop, estimate, d, spec.k)
        return guarded_run(data, spec.k, path, gram, reason, test, rng, person)


def _rho_of(steps: list[PrivacyStep]) -> float:
    """``sum rho`` in doubles, only to pick the largest (the ledger sums exactly)."""
    return sum(
        (s.sensitivity / s.sigma) ** 2 / 2.0 if isinstance(s, GaussianStep) else s.epsilon**2 / 2.0
        for s in steps
    )


def _without_delta(step: PrivacyStep) -> PrivacyStep:
    """An approximate step's ``rho`` alone (its delta is counted once, as the path's)."""
    return PureStep(step.epsilon) if isinstance(step, ApproximateStep) else step
