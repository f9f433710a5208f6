"""Preview before spending: what a release request would cost and use, without charging it.

A dry run goes through exactly the checks of a real request up to the charge
(:func:`service.releases.check_request_fields`, the dataset lookup,
:func:`service.releases.check_request`), so it is refused with the same 4xx. Then, instead of
charging, it reports the cost, whether the remaining budget covers it (a real request would get
409 ``budget_exceeded``; a preview answers ``affordable: false``), and the mechanism's noise
scales from :meth:`~service.mechanisms.base.Mechanism.preview`, which calls the same calibration
functions as the run. It reads public facts only (shape, declared bound, params, the ledger),
never the rows, and writes one ``release_previewed`` audit event: no release, no ledger row.

An ``Idempotency-Key`` is refused: a preview creates nothing that a retry could find again, and
a key sent by mistake with ``dry_run`` would otherwise suggest that something was reserved.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy.orm import Session

from api_schemas.releases import ReleaseRequest
from service import (
    accounting,
    advice,
    audit,
    ledger,
    priors,
    privacy_unit,
    privacy_unit_centre,
    releases,
    spend,
    visibility,
)
from service.auth import Principal
from service.config import Settings
from service.db.models import Dataset, utcnow
from service.errors import InvalidInput
from service.mechanisms import sign_forecast
from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.auto import Auto
from service.mechanisms.auto import plan as auto_plan
from service.mechanisms.base import Preview, PreviewValue, PublicContext, ReleaseSpec
from service.mechanisms.components import component
from service.mechanisms.dominance import DominanceWarning, dominance_warnings
from service.prior_projection import columns_inside, unwrapped

DRY_RUN_IDEMPOTENCY_KEY = (
    "a dry run creates and charges nothing, so it takes no Idempotency-Key; omit the header"
)


@dataclass(frozen=True)
class ReleasePreview:
    """The outcome of a dry run (see :class:`api_schemas.releases.ReleasePreview`)."""

    dataset_id: uuid.UUID
    mechanism: str
    k: int
    epsilon: Decimal
    delta: Decimal
    params: dict[str, Any]
    accounting: str
    mu: Decimal | None
    rho: Decimal | None
    zcdp_delta: Decimal | None
    rho_remaining: Decimal | None
    mu_remaining: Decimal | None
    delta_reserved_for_conversion: Decimal | None
    releases_remaining: int | None
    affordable: bool
    epsilon_remaining: Decimal
    delta_remaining: Decimal
    budget: Literal["dataset", "grant"]
    grant_id: uuid.UUID | None
    memory_mb: float
    scales: dict[str, PreviewValue]
    meaning: list[str]
    recommended_accounting: str
    recommendation_reason: str
    warnings: list[DominanceWarning]
    #: ``hybrid``: which of its filters would admit the release (``None`` elsewhere).
    admitted_by: list[str] | None = None
    #: Not affordable and asked in epsilon: the largest epsilon the same request is admitted
    #: at now (:func:`service.releases.admissible_search`), as a real request's 409 says.
    epsilon_admissible: Decimal | None = None
    #: No epsilon admitted at its delta: another delta and the epsilon admitted with it.
    delta_admissible: Decimal | None = None
    delta_admissible_epsilon: Decimal | None = None
    #: What the budget figures protect (``row`` or ``person``): stated with them.
    privacy_unit: Literal["row", "person"] = "row"
    #: What a pure release (delta 0) is admitted at now in that budget, as GET .../budget (or
    #: the grant) states it: on hybrid and zcdp not ``epsilon_remaining`` (a Gaussian release's
    #: figure at the budget's delta), so a user choosing a pure release reads it here too.
    epsilon_remaining_pure: Decimal | None = None


def _finite(value: PreviewValue) -> PreviewValue:
    """A non-finite float as ``None``: JSON has no infinity, and a preview must never fail on a
    request the real path accepts (``prepare`` already keeps every scale finite)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def releases_remaining(budget: ledger.BudgetState, charge: ledger.Charge) -> int | None:
    """How many more releases of ``charge`` the remaining budget buys (``None``: unlimited).
    ``hybrid``: the most any one filter admits (the rule admits ``n`` more iff some filter
    admits the whole sequence with all ``n``)."""
    if budget.accounting == "hybrid":
        return _hybrid_releases_remaining(budget, charge)
    counts = [
        accounting.releases_affordable(remaining, cost)
        for remaining, cost in (
            (budget.rho_remaining, charge.rho),
            (budget.delta_remaining, charge.delta),
            (budget.epsilon_remaining, charge.epsilon),
        )
    ]
    finite = [count for count in counts if count is not None]
    return min(finite) if finite else None


def _shown_mu(kind: str, costs: accounting.StepCosts) -> Decimal | None:
    """The release's GDP ``mu``: every step Gaussian; on ``hybrid`` also with pure steps (its
    filter A' charges ``mu^2``, pure steps at ``pure_mu``)."""
    if kind == "hybrid" and costs.gdp is not None:
        return accounting.sqrt_up(costs.gdp)
    return costs.mu


def _hybrid_releases_remaining(budget: ledger.BudgetState, charge: ledger.Charge) -> int | None:
    state = budget.hybrid()
    cost = charge.release_cost()
    limits = state.budget
    subtract = ledger.BUDGET_CONTEXT.subtract
    per_filter: list[list[int | None]] = []
    if state.all_gdp and cost.gdp is not None:
        left = subtract(limits.gdp_total, state.gdp_spent)
        per_filter.append([accounting.releases_affordable(left, cost.gdp)])
    if state.all_profiled and cost.rho is not None and cost.zcdp_delta is not None:
        per_filter.append(
            [
                accounting.releases_affordable(
                    subtract(limits.rho_total, state.rho_spent), cost.rho
                ),
                accounting.releases_affordable(
                    subtract(limits.delta_mechanisms, state.zcdp_delta_spent), cost.zcdp_delta
                ),
            ]
        )
    per_filter.append(
        [
            accounting.releases_affordable(
                subtract(limits.epsilon, state.epsilon_spent), cost.epsilon
            ),
            accounting.releases_affordable(
                subtract(limits.delta_basic, state.delta_spent), cost.delta
            ),
        ]
    )
    counts: list[int] = []
    for limits_of_filter in per_filter:
        finite = [count for count in limits_of_filter if count is not None]
        if not finite:
            return None  # a filter this release costs nothing under
        counts.append(min(finite))
    return max(counts)


def preview_release(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    idempotency_key: str | None,
    settings: Settings,
    forecast_from: uuid.UUID | None = None,
) -> ReleasePreview:
    """Validate ``body`` as :func:`service.releases.request_release` does and report what it
    would cost and use; charge nothing and record one ``release_previewed`` audit event."""
    releases.check_request_fields(principal, body)
    if idempotency_key is not None:
        raise InvalidInput("Idempotency-Key", DRY_RUN_IDEMPOTENCY_KEY)
    dataset = releases.lock_dataset(session, dataset_id)
    # The same preparation (a default delta fitted to the grant) and the same budgets as the
    # real request: the applicable grant (a key without one is refused the same way when grants
    # are required), then the dataset.
    priced = releases.price(session, principal, dataset, body, settings, persist_prior=False)
    grant, prepared, share = priced.grant, priced.prepared, priced.share
    charge = prepared.charge
    budget = priced.budget
    affordable = budget.affords(charge)
    charged_to: Literal["dataset", "grant"] = "dataset"
    if share is not None:
        if affordable or not share.affords(charge):
            # The analyst's own limit is the grant's (when both afford it, or the grant is short:
            # a real request checks the grant first and its 409 names the grant); only when the
            # grant affords it and the dataset does not are the dataset's figures the ones short.
            charged_to, budget = "grant", share
        affordable = affordable and share.affords(charge)
    # What a real request's 409 would offer (the same request at the largest epsilon admitted)
    # is searched by the route afterwards, without the dataset's lock
    # (:func:`service.releases.admissible_search`).
    shown = prepared.mechanism.preview(prepared.context, prepared.spec)
    if forecast_from is not None:
        shown = with_forecast_from(session, principal, dataset, prepared, shown, forecast_from)
    memory_bytes = prepared.mechanism.memory_bytes(prepared.context, prepared.spec)
    if dataset.privacy_unit_column is not None:
        memory_bytes += privacy_unit.extra_bytes(
            prepared.mechanism.name, dataset.n_rows, dataset.n_cols, prepared.spec.params
        )
        # A private centre or clip quantile per person: the mean's noise at n_units.
        person_scales, person_notes = privacy_unit_centre.preview_scales(
            prepared.mechanism.name,
            prepared.spec,
            dataset.n_units or 0,
            # Inside a public prior the run has its m columns (prior_projection.run_inside).
            columns_inside(prepared.mechanism, dataset.n_cols),
        )
        shown = replace(
            shown,
            scales={**shown.scales, **person_scales},
            meaning=[*shown.meaning, *person_notes],
        )
    memory = memory_bytes / releases.MIB
    audit.record(
        session,
        "release_previewed",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={
            "mechanism": body.mechanism,
            "k": body.k,
            "params": prepared.params,
            "cost": releases.cost_details(dataset.accounting, prepared),
            "affordable": affordable,
            **privacy_unit.event_details(dataset),
        },
    )
    # The remaining figures as GET .../budget (or the grant) states them.
    stated = spend.statement(budget)
    admitted_by = None
    if dataset.accounting == "hybrid":
        admitted_by = budget.hybrid().filters_admitting(charge.release_cost())
    fits = recommendation(dataset, body.mechanism, prepared.epsilon, prepared.costs)
    return ReleasePreview(
        dataset_id=dataset.id,
        privacy_unit=privacy_unit.unit_of(dataset),
        mechanism=prepared.mechanism.name,
        k=body.k,
        epsilon=prepared.epsilon,
        delta=prepared.delta,
        params=prepared.params,
        accounting=dataset.accounting,
        mu=_shown_mu(dataset.accounting, prepared.costs),
        rho=prepared.costs.rho,
        zcdp_delta=prepared.costs.delta,
        rho_remaining=stated.native.rho_remaining,
        mu_remaining=stated.native.mu_remaining,
        delta_reserved_for_conversion=stated.delta_reserved_for_conversion,
        releases_remaining=releases_remaining(budget, charge),
        affordable=affordable,
        admitted_by=admitted_by,
        epsilon_remaining=stated.epsilon_remaining,
        epsilon_remaining_pure=stated.epsilon_remaining_pure,
        delta_remaining=stated.delta_remaining,
        budget=charged_to,
        grant_id=grant.id if grant is not None else None,
        memory_mb=memory,
        scales={name: _finite(value) for name, value in shown.scales.items()},
        meaning=[
            *shown.meaning,
            *privacy_unit.preview_notes(
                dataset,
                prepared.mechanism.name,
                getattr(prepared.spec.params, "clip_norm", None),
                isinstance(getattr(prepared.spec.params, "center", None), list),
            ),
            *accounting_note(dataset, prepared.costs),
            *hybrid_note(admitted_by),
        ],
        recommended_accounting=fits.accounting,
        recommendation_reason=fits.reason,
        warnings=dominance_warnings(
            body.mechanism,
            float(prepared.delta),
            dataset.n_cols,
            # the variant that runs: the accounting's default is applied to the params
            noise=getattr(prepared.spec.params, "noise", None),
        ),
    )


def with_forecast_from(
    session: Session,
    principal: Principal,
    dataset: Dataset,
    prepared: releases.Prepared,
    shown: Preview,
    forecast_from: uuid.UUID,
) -> Preview:
    """``shown`` with the forecast from an earlier release (``?forecast_from=``, issue 32 item
    4): one the caller may read (:func:`service.releases.get_release`; 404 otherwise), of the
    same dataset and mechanism, succeeded, run inside the same public prior as the request
    (or, like it, inside none): its figures then describe the same rows (inside a prior, the
    rows projected onto its span, at its ``m`` columns). It reads only that release's params
    and extras, already released to the caller: no budget, no rows."""
    earlier = releases.get_release(session, principal, forecast_from)
    mechanism, prior_sha256 = unwrapped(prepared.mechanism)
    if earlier.dataset_id != dataset.id:
        raise InvalidInput("forecast_from", "a release of another dataset")
    if not isinstance(mechanism, AnalyzeGauss | Auto):
        raise InvalidInput(
            "forecast_from",
            "a forecast from a release is made for analyze_gauss, and for auto (PrivatePCA's "
            f"default) from an auto release of a PCA request, not {mechanism.name}",
        )
    if earlier.mechanism != mechanism.name:
        raise InvalidInput(
            "forecast_from",
            f"release {earlier.id} is a {earlier.mechanism} release: a forecast is made from "
            f"an earlier {mechanism.name} release",
        )
    earlier_params, earlier_prior = priors.split_params(earlier.params or {})
    if earlier_prior.get(priors.SHA256_FIELD) != prior_sha256:
        raise InvalidInput("forecast_from", _other_prior(earlier.id, earlier_prior, prior_sha256))
    # Its status as the caller sees it now, never the real one: before the earlier release's
    # visible_at an analyst sees it queued, and whether it has run would tell the run time
    # its padding hides (its extras, released early, even more).
    seen = visibility.view(session, earlier, principal, utcnow())
    if seen.status != "succeeded" or not seen.shows_result or earlier.result_extras is None:
        raise InvalidInput("forecast_from", f"release {earlier.id} has no result you may read yet")
    extras = earlier.result_extras
    # Inside a prior both runs have its m columns (prior_projection.columns_inside).
    context = replace(prepared.context, n_cols=columns_inside(prepared.mechanism, dataset.n_cols))
    if isinstance(mechanism, Auto):
        found = _auto_forecast_from(context, prepared.spec, earlier.k, extras)
    else:
        params = mechanism.parse_params(earlier_params)
        spec = ReleaseSpec(earlier.k, float(earlier.epsilon), float(earlier.delta), params)
        found = mechanism.forecast_from(context, prepared.spec, spec, extras)
    if found is None:
        raise InvalidInput("forecast_from", f"release {earlier.id} has no explained variance")
    scales, meaning = found
    if prior_sha256 is not None:
        meaning = [
            *meaning,
            "Inside the public prior, the forecast shares are of the rows projected onto its "
            "span (as the earlier release's figures are), not of all their variance.",
        ]
    return Preview(scales={**shown.scales, **scales}, meaning=[*shown.meaning, *meaning])


def _auto_forecast_from(
    ctx: PublicContext, spec: ReleaseSpec[Any], earlier_k: int, extras: dict[str, Any]
) -> tuple[dict[str, Any], list[str]] | None:
    """``?forecast_from=`` for ``auto`` (what ``PrivatePCA`` sends by default): a PCA request
    (centred) runs one Gram mechanism chosen from public facts, so the forecast is that
    mechanism's, from the earlier release's ``auto_choice`` and the component's params and
    budget it released (``auto_params``, ``auto_epsilon``, ``auto_delta``) to the component
    this request would run. Refused (422) where the two ran different mechanisms or the
    request is uncentred (auto may run an aggregator, which states no share)."""
    the_plan = auto_plan(ctx, spec.k, spec.epsilon, spec.delta, spec.params)
    chosen = the_plan.default
    if the_plan.paths() or spec.params.center == "none":
        raise InvalidInput(
            "forecast_from", "a forecast for auto is made for PCA requests (center not 'none')"
        )
    ran = extras.get("auto_choice")
    if ran != chosen.name or chosen.name not in ("analyze_gauss", "spatial_sign"):
        raise InvalidInput(
            "forecast_from",
            f"the earlier release ran {ran}, this request would run {chosen.name}: a forecast "
            "from a release is made between releases of the same mechanism",
        )
    try:
        earlier = ReleaseSpec(
            earlier_k,
            float(extras["auto_epsilon"]),
            float(extras["auto_delta"]),
            component(chosen.name).parse_params(extras["auto_params"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if chosen.name == "spatial_sign":
        return sign_forecast.forecast_from(chosen.spec(spec.k), earlier, extras)
    return AnalyzeGauss().forecast_from(ctx, chosen.spec(spec.k), earlier, extras)


def _other_prior(release_id: uuid.UUID, earlier: dict[str, Any], now: str | None) -> str:
    """Why an earlier release's figures do not forecast this request: they describe the rows
    inside another public prior's span (or all rows, or the request's are all rows)."""
    then = earlier.get(priors.SHA256_FIELD)
    if then is None:
        where = "ran without a public prior, and this request runs inside one"
    elif now is None:
        where = "ran inside a public prior, and this request runs without one"
    else:
        where = "ran inside another public prior than this request's"
    return (
        f"release {release_id} {where}: its figures describe other rows' variance than this "
        "request's; forecast from a release made inside the same prior (or none)"
    )


def accounting_note(dataset: Dataset, costs: accounting.StepCosts) -> list[str]:
    """On a ``zcdp`` dataset, for a purely Gaussian release: how much less noise the same share
    of the same ``(epsilon, delta)`` carries under ``gaussian`` accounting (a public function
    of the dataset's budget: ``sqrt(rho_B / (mu_B^2/2))``), so an owner who plans only
    Gaussian releases can choose it at upload (issue 31, item 5)."""
    if dataset.accounting != "zcdp" or not costs.gaussian or dataset.rho_total is None:
        return []
    if dataset.delta_total <= 0:
        return []
    mu = accounting.mu_budget(dataset.epsilon_total, dataset.delta_total)
    if mu <= 0 or dataset.rho_total <= 0:
        return []
    ratio = math.sqrt(float(dataset.rho_total) / (float(mu) ** 2 / 2.0))
    return [
        f"This release is purely Gaussian: on a dataset of the same (epsilon, delta) with "
        f"accounting gaussian the same share of the budget would carry {1.0 - ratio:.1%} less "
        "noise (zcdp pays for its conversion to (epsilon, delta) and the delta it reserves; "
        "it admits every mechanism with a proven profile, gaussian only Gaussian ones)."
    ]


_FILTER_NAMES = {
    "gdp": "the Gaussian-DP filter (Gaussian steps, and pure steps at their GDP mu)",
    "zcdp": "the approximate-zCDP filter",
    "basic": "the basic filter (sums of epsilon and delta)",
}


def hybrid_note(admitted_by: list[str] | None) -> list[str]:
    """On a ``hybrid`` dataset: which of its filters would admit this release (public: the
    release's declared cost and the ledger's sums), or that none would."""
    if admitted_by is None:
        return []
    if not admitted_by:
        return [
            "No filter of this dataset's hybrid accounting would admit this release now: a "
            "real request would be refused with 409 (ask for less: epsilon_admissible is what "
            "this request is admitted at, epsilon_remaining a Gaussian release at the budget's "
            "delta, epsilon_remaining_pure a pure release at delta 0)."
        ]
    names = "; ".join(_FILTER_NAMES[name] for name in admitted_by)
    return [f"This dataset's hybrid accounting would admit this release by: {names}."]


def recommendation(
    dataset: Dataset, mechanism: str, epsilon: Decimal, costs: accounting.StepCosts
) -> advice.Advice:
    """The accounting that fits releases like this one (:func:`service.advice.for_one_request`):
    from the steps this release declares (none: only ``basic`` has a rule for it; all
    Gaussian: ``hybrid``, the default, since one request is no plan of only Gaussian releases)
    and how many releases of its epsilon the dataset's stated epsilon holds (the plan the
    request implies). Public facts only.

    ``auto`` is judged by the steps it declares for this request, like any mechanism: PCA by
    ``auto`` (PrivatePCA's default) declares only Gaussian steps where it runs
    ``analyze_gauss``, and the one-request advice for those is ``hybrid``, which never leads
    to ``gaussian`` (where ``auto`` could only become ``analyze_gauss``)."""
    if costs.rho is None:
        kind: advice.Kind = "unprofiled"
    elif costs.gaussian:
        kind = "gaussian"
    else:
        kind = "mixed"
    releases = advice.releases_of(dataset.epsilon_total, epsilon)
    return advice.for_one_request([mechanism], kind, releases)
