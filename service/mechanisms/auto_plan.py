"""What ``auto`` can run, from public facts only (:mod:`~service.mechanisms.auto`): its params
and its plan, the candidates and their budgets before any private step.

The plan is a deterministic function of public facts (the shape, the clip norm, the privacy
unit, ``(epsilon, delta)`` and the request's params): ``prepare``, ``privacy_steps``, the dry
run and ``run`` each recompute it and so declare, charge and run the same paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from service.mechanisms.auto_count import CountPath, count_path
from service.mechanisms.auto_explain import centring_sentence
from service.mechanisms.auto_gram import centre_offset_ratio, gram_candidate, gram_sentence
from service.mechanisms.auto_guard import (
    Choice,
    FriendlyPath,
    checked_path,
    friendly_path,
    people_short,
    person_level_path,
    prepared,
)
from service.mechanisms.base import InvalidParameter, PublicContext, resolve_clip_norm
from service.mechanisms.centring import CenterParams

#: Default share of epsilon spent on the private estimate: where analyze_gauss wins, its
#: deficit (~1/eps^2) then grows by at most (1 - s)^-2 = 1.06.
DEFAULT_STRUCTURE_SHARE = 0.03


class AutoParams(CenterParams):
    """Params of ``auto``: the clip norm, the centring (PCA semantics) and the share of epsilon
    of the private estimate.

    With ``center`` other than ``"none"`` only the Gram mechanisms apply (the aggregators do not
    centre): ``analyze_gauss`` (``delta > 0``) as its own default PCA request (clip at the
    private ``DEFAULT_PRIVATE_CENTRE_QUANTILE`` of the row norms; with ``"private"`` the
    centring route chosen from its probe), ``spatial_sign`` with the same centring in high
    dimension (``d >= n^(2/3)``; with ``"private"`` only where the private centre's error stays
    below the Gram noise, :func:`~service.mechanisms.auto_gram.centre_offset_ratio`; it then
    releases analyze_gauss's explained-variance figures too), or ``smooth_sensitivity``
    (``delta = 0``).
    """

    structure_share: float = Field(
        default=DEFAULT_STRUCTURE_SHARE,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description=(
            "Share s of epsilon spent on a private estimate of how near the rows are to a "
            "k-dim subspace (noisy tail and trace of X^T X, pure DP), from which auto predicts "
            "its Gram candidate's and friendly_aggregate's errors and runs the smaller. "
            "0 disables every private choice (the Gram candidate)."
        ),
    )


@dataclass(frozen=True)
class Plan:
    """What ``auto`` can run, from public facts only: ``default`` (without an estimate, or
    analyze_gauss at ``(1 - s) eps`` after it), the estimate's ``test_epsilon``, and friendly's
    two paths at ``(1 - s) eps``: ``sure`` (no weight check) when the estimate says friendly wins
    at both ends, ``unsure`` (a weight check of ``eps_w`` first) when only at the optimistic
    end."""

    default: Choice
    reason: str
    notes: list[str] = field(default_factory=list)
    test_epsilon: float = 0.0
    sure: FriendlyPath | None = None
    unsure: FriendlyPath | None = None
    counted: CountPath | None = None

    def paths(self) -> list[FriendlyPath]:
        counted = [] if self.counted is None else [self.counted.path]
        return [p for p in (self.sure, self.unsure) if p is not None] + counted

    def choices(self) -> list[Choice]:
        extra = [] if self.counted is None else [self.counted.default]
        return [self.default, *extra, *(c for p in self.paths() for c in p.choices())]


def plan(ctx: PublicContext, k: int, epsilon: float, delta: float, params: AutoParams) -> Plan:
    """The candidates and their budgets from public facts (deterministic: ``run`` recomputes
    it); raises :class:`InvalidParameter` as a chosen mechanism's ``prepare`` would."""
    clip = resolve_clip_norm(params.clip_norm, ctx)
    centred = params.center != "none"
    if ctx.n_units is not None and delta == 0:
        raise InvalidParameter(
            "privacy_unit_column",
            "this dataset's privacy unit is a person: with delta = 0 auto's only candidate is "
            "smooth_sensitivity, whose local sensitivity is per row and cannot bound a person; "
            "give delta > 0 (analyze_gauss and friendly_aggregate are made per person)",
        )
    if delta == 0:
        raw: dict[str, Any] = {"clip_norm": clip}
        if centred:
            raw.update(center=params.center, center_share=params.center_share)
        reason = "delta = 0: smooth_sensitivity (Cauchy) is the only pure-DP mechanism"
        reason += "; " + centring_sentence(params, delta) if centred else ""
        return Plan(prepared("smooth_sensitivity", ctx, k, epsilon, delta, raw), reason)
    name, gram = gram_candidate(ctx, params, clip, epsilon, delta)
    centre = {"clip_norm": clip, "center": params.center, "center_share": params.center_share}
    ratio = centre_offset_ratio(ctx.n_rows, ctx.n_cols, epsilon, delta, centre)
    why_gram = gram_sentence(name, ctx.n_rows, ctx.n_cols, ctx.n_units is not None, ratio)
    if centred:
        clauses = [centring_sentence(params, delta, name), why_gram]
        return Plan(
            prepared(name, ctx, k, epsilon, delta, gram),  # high dimension: why first
            "; ".join(clauses if name == "analyze_gauss" else clauses[::-1])
            + "; the aggregators do not centre",
        )
    if k >= ctx.n_cols:
        # A public fact: k orthonormal columns in R^d with k = d span it, whatever the rows, so
        # no estimate could change the released subspace; the Gram candidate gets the test's
        # share too (its explained-variance figures and eigenvalues are the better for it).
        return Plan(
            prepared(name, ctx, k, epsilon, delta, gram),
            f"{name}: {why_gram}; k = d: every rank-d basis spans the whole space, so no "
            "estimate could change the released subspace (no structure test)",
        )
    notes: list[str] = []
    share = params.structure_share
    rest = (1.0 - share) * epsilon
    sure = friendly_path(ctx, k, rest, 0.0, delta, (name, gram), notes) if share > 0 else None
    sure = person_level_path(ctx, sure, notes)
    counted = None if sure is None else count_path(ctx, k, rest, delta, (name, gram), notes)
    counted = None if counted is None or people_short(counted.path, ctx.n_units) else counted
    unsure = (
        None if sure is None else checked_path(ctx, k, rest, sure.run, delta, (name, gram), notes)
    )
    if sure is None:
        why = "; ".join(notes) or (
            "structure test disabled (structure_share = 0; the default on a gaussian dataset, "
            "whose Gaussian-DP filter cannot charge the tests' pure steps)"
        )
        return Plan(
            prepared(name, ctx, k, epsilon, delta, gram),
            f"{name}: {why_gram}; no aggregator can run here, so no estimate could change the "
            f"choice; {why}",
            notes,
        )
    return Plan(
        prepared(name, ctx, k, rest, delta, gram),
        "friendly_aggregate can run: a private estimate of the rows' distance to a k-dim "
        f"subspace predicts its error and {name}'s, and the smaller runs; {why_gram}",
        notes,
        test_epsilon=share * epsilon,
        sure=sure,
        unsure=unsure,
        counted=counted,
    )
