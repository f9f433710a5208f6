"""``auto``: the service chooses the mechanism and its params (issue 16, item 1).

The rule table comes from the benchmark grid (``bench/bench_auto_grid.py``,
``bench/results/auto_grid.csv``; ``docs/mechanisms.md``, section ``auto``):

- ``delta = 0``: ``smooth_sensitivity`` (Cauchy), the only pure mechanism.
- ``delta > 0``: ``analyze_gauss`` wins wherever the data is not within about 1e-2 of a
  k-dimensional subspace (relative to the row norms), and ``gap_perturbation`` and the
  Gaussian ``smooth_sensitivity`` never beat it (derivation in the docs), so neither is chosen.
  ``friendly_aggregate`` is 1-480x better than ``analyze_gauss`` when the rows are that close to
  a subspace (``eps = 1``, ``n = 50,000``), and worse beyond. When it can run at the reduced
  budget (its own ``prepare`` accepts it) and ``structure_share > 0``, a **private structure
  test** decides between the two. Where no test is affordable (``eps = 0.1``, ``n = 50,000``:
  the test's noise would swamp its threshold) ``analyze_gauss`` is kept (docs, section ``auto``).

Structure test: ``tail = sum_{i>k} lambda_i(H)`` of the clipped ``H = X^T X`` is the smallest
residual ``min_P sum_i ||(I - P) x_i||^2`` over rank-k projectors ``P``, and each term lies in
``[0, C^2]``: replacing one row moves every ``P``'s objective by at most ``C^2``, hence the
minimum too; ``trace(H) = sum_i ||x_i||^2`` likewise. Each gets ``Lap(2 C^2/eps_s)`` with
``eps_s = structure_share * epsilon`` (``eps_s/2`` each: pure ``(eps_s, 0)``-DP). The ratio
``rho = tail_hat/trace_hat`` (post-processing) is the mean squared relative distance of the
rows to the best k-dim subspace; the aggregator is chosen iff ``rho < TAIL_RATIO_THRESHOLD``.

Privacy: sequential (adaptive) composition of the test ``(s eps, 0)`` and the chosen mechanism
run at ``((1 - s) eps, delta)``; the choice is post-processing of the test and of public facts
(``n``, ``d``, ``k``, ``epsilon``, ``delta``, ``C``, params). Total exactly ``(eps, delta)``,
declared before the run. Without a test (``structure_share = 0``, ``delta = 0``, or the
aggregator refused from public facts) the chosen mechanism gets all of ``(eps, delta)``.
Only the choice (one of two names, and a fixed reason string) is released beside the chosen
mechanism's own output: no noisy statistic of the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from service.mechanisms.base import (
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    Preview,
    PreviewValue,
    PublicContext,
    ReleaseSpec,
    check_clip_scale,
    resolve_clip_norm,
)
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigenvalues_desc,
    eigh_memory,
)
from service.mechanisms.noise import laplace

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

#: ``t^2 d^2`` above which the projection aggregator's pairwise distances (in ``R^{d^2}``) are
#: too slow; the reference-points aggregator (``R^{2k d}``) is used instead.
PROJECTION_WORK_CAP = 2e10


class AutoParams(MechanismParams):
    """Params of ``auto``: the clip norm and the share of epsilon for the structure test."""

    clip_norm: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Public row norm bound C (for analyze_gauss, smooth_sensitivity and the structure "
            "test). Defaults to the dataset's row_norm_bound. Never computed from the data."
        ),
    )
    structure_share: float = Field(
        default=DEFAULT_STRUCTURE_SHARE,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description=(
            "Share s of epsilon spent on a private structure test (noisy tail ratio of X^T X, "
            "pure DP) that decides between analyze_gauss and friendly_aggregate; the chosen "
            "mechanism gets (1 - s) epsilon and all of delta. Spent only when both can run; "
            "0 disables the test (analyze_gauss then)."
        ),
    )


@dataclass(frozen=True)
class Choice:
    """One candidate: a registered mechanism, its resolved params, its budget."""

    name: str
    params: MechanismParams
    epsilon: float
    delta: float


@dataclass(frozen=True)
class Plan:
    """What ``auto`` runs, from public facts only.

    ``aggregator`` is ``None`` when no structure test runs; then ``default`` runs with the
    whole budget. Otherwise the test spends ``test_epsilon`` and picks one of the two.
    """

    default: Choice
    aggregator: Choice | None
    test_epsilon: float
    reason: str
    notes: list[str] = field(default_factory=list)


def _registered(name: str) -> Mechanism[Any]:
    # Imported here: the registry imports this module.
    from service.mechanisms.registry import get_mechanism

    mechanism = get_mechanism(name)
    assert mechanism is not None, name
    return mechanism


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


def _aggregator(
    ctx: PublicContext, k: int, epsilon: float, delta: float, notes: list[str]
) -> Choice | None:
    """``friendly_aggregate`` at ``(epsilon, delta)`` with the best aggregator that its own
    ``prepare`` accepts and that fits the memory and work caps; ``None`` if none does."""
    mechanism = _registered("friendly_aggregate")
    for aggregator in ("projection", "reference_points"):
        try:
            choice = _prepare(
                "friendly_aggregate", ctx, k, epsilon, delta, {"aggregator": aggregator}
            )
        except InvalidParameter as refusal:
            note = f"friendly_aggregate refused at this budget: {refusal.message}"
            if note not in notes:  # both aggregators share most refusals (t, n)
                notes.append(note)
            continue
        t = getattr(choice.params, "t", None) or 1
        if (
            aggregator == "projection"
            and float(t) ** 2 * float(ctx.n_cols) ** 2 > PROJECTION_WORK_CAP
        ):
            notes.append("projection aggregator skipped: t^2 d^2 above the work cap")
            continue
        spec = ReleaseSpec(k=k, epsilon=epsilon, delta=delta, params=choice.params)
        if mechanism.memory_bytes(ctx, spec) > AGGREGATOR_MEMORY_CAP:
            notes.append(f"friendly_aggregate ({aggregator}) skipped: memory above the cap")
            continue
        return choice
    return None


def plan(ctx: PublicContext, k: int, epsilon: float, delta: float, params: AutoParams) -> Plan:
    """The choice from public facts (raises :class:`InvalidParameter` like the chosen
    mechanism's ``prepare`` would). Deterministic: ``run`` recomputes it from the same facts."""
    clip = resolve_clip_norm(params.clip_norm, ctx)
    gram_raw = {"clip_norm": clip}
    if delta == 0:
        choice = _prepare("smooth_sensitivity", ctx, k, epsilon, delta, gram_raw)
        return Plan(
            choice,
            None,
            0.0,
            "delta = 0: smooth_sensitivity (Cauchy) is the only pure-DP mechanism",
        )
    notes: list[str] = []
    share = params.structure_share
    if share > 0:
        main_epsilon = (1.0 - share) * epsilon
        aggregator = _aggregator(ctx, k, main_epsilon, delta, notes)
        if aggregator is not None and not structure_test_useful(ctx.n_rows, share * epsilon):
            notes.append(
                "friendly_aggregate could run, but at this n and epsilon the structure test's "
                "noise would swamp its threshold"
            )
        elif aggregator is not None:
            default = _prepare("analyze_gauss", ctx, k, main_epsilon, delta, gram_raw)
            return Plan(
                default,
                aggregator,
                share * epsilon,
                "friendly_aggregate can run: a private structure test (noisy tail ratio of "
                "X^T X) chooses it when the rows are within about 5% (relative) of a "
                "k-dimensional subspace, else analyze_gauss",
                notes,
            )
    default = _prepare("analyze_gauss", ctx, k, epsilon, delta, gram_raw)
    why = "; ".join(notes) if notes else "structure test disabled (structure_share = 0)"
    return Plan(
        default,
        None,
        0.0,
        "analyze_gauss: the dependable default; no aggregator can run here (" + why + ")",
        notes,
    )


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
        "Chooses the mechanism from public facts (n, d, k, epsilon, delta, C) and, when "
        "friendly_aggregate can run, a private structure test with structure_share of epsilon: "
        "friendly_aggregate when the rows are very near a k-dim subspace, else analyze_gauss; "
        "smooth_sensitivity (Cauchy) when delta = 0. The result's extras and the dry run say "
        "what was chosen and why (auto_choice, auto_reason)."
    )
    cost_rule: ClassVar[str] = (
        "Charges exactly the requested (epsilon, delta): the structure test (structure_share * "
        "epsilon, 0) and the chosen mechanism (the rest) compose sequentially."
    )
    params_model: ClassVar[type[AutoParams]] = AutoParams
    allows_pure_dp: ClassVar[bool] = True

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
        choices = [plan_.default] + ([plan_.aggregator] if plan_.aggregator else [])
        return [
            (c, ReleaseSpec(k=k, epsilon=c.epsilon, delta=c.delta, params=c.params))
            for c in choices
        ]

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]) -> Preview:
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        assert spec.params.clip_norm is not None  # resolved by prepare
        choice = (
            the_plan.default.name
            if the_plan.aggregator is None
            else f"{the_plan.aggregator.name} or {the_plan.default.name} (structure test)"
        )
        scales: dict[str, PreviewValue] = {
            "auto_choice": choice,
            "auto_reason": the_plan.reason,
            "structure_test": the_plan.aggregator is not None,
        }
        meaning = [f"auto chooses {choice}: {the_plan.reason}."]
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
                f"{TAIL_RATIO_THRESHOLD:g}, else analyze_gauss, each with epsilon "
                f"{the_plan.default.epsilon:.4g} and all of delta."
            )
        for choice_, inner in self._specs(the_plan, spec.k):
            shown = _registered(choice_.name).preview(ctx, inner)
            for key, value in shown.scales.items():
                scales[f"{choice_.name}.{key}"] = value
            meaning.extend(f"{choice_.name}: {line}" for line in shown.meaning)
        return Preview(scales=scales, meaning=meaning)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[AutoParams]) -> int:
        the_plan = plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
        d = ctx.n_cols
        inner = max(
            _registered(c.name).memory_bytes(ctx, s) for c, s in self._specs(the_plan, spec.k)
        )
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
        chosen, reason = the_plan.default, the_plan.reason
        if the_plan.aggregator is not None:
            if structure_test(data, spec.k, params.clip_norm, the_plan.test_epsilon, rng):
                chosen = the_plan.aggregator
                reason = "the private structure test found the rows very near a k-dim subspace"
            else:
                reason = "the private structure test found the rows not near a k-dim subspace"
        inner = ReleaseSpec(
            k=spec.k, epsilon=chosen.epsilon, delta=chosen.delta, params=chosen.params
        )
        output = _registered(chosen.name).run(data, inner, rng)
        output.extras = {
            **output.extras,
            "auto_choice": chosen.name,
            "auto_reason": reason,
            "auto_params": chosen.params.model_dump(mode="json"),
        }
        return output
