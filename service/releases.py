"""Release requests: validate, check and charge the budget, queue the job; read results.

One transaction decides a release: the dataset lock, the budget check, the ledger charge, the
queued release and its audit event commit together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from api_schemas.common import BUDGET_CONTEXT, canonical_decimal, unknown_name
from api_schemas.releases import ReleaseRequest
from service import (
    accounting,
    audit,
    charges,
    commit_order,
    datasets,
    grants,
    ledger,
    priors,
    privacy_unit,
    reference,
    registration_visibility,
    release_calibration,
    repricing,
    spend,
    tracing,
    wake,
)
from service.auth import Principal, require_role, sees_real_state
from service.config import Settings
from service.db.models import Dataset, Grant, Release, ReleaseBasis, utcnow
from service.default_delta import refuse_zero_default, with_default_delta
from service.errors import (
    BudgetExceeded,
    DatasetGone,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
    size_text,
)
from service.keyformat import KEY_PREFIX
from service.mechanisms.base import Mechanism, PublicContext, ReleaseSpec
from service.mechanisms.linalg import DEFAULT_CHUNK_ROWS
from service.mechanisms.registry import MECHANISMS, get_mechanism
from service.padding_epochs import request_queue_seconds
from service.padding_queue import padding_model
from service.prior_projection import on_prior
from service.release_rows import insert_release, read_release

IDEMPOTENCY_KEY_REUSED = "this Idempotency-Key was already used with a different request"

MIB = 1024 * 1024


def _check_places(field: str, value: Decimal) -> None:
    """A cost the ledger would round (too many places or digits) is refused, not rounded."""
    ledger.check_storable(field, value)


def _canonical(value: Decimal | None) -> str | None:
    return None if value is None else canonical_decimal(value)


def given_currency(body: ReleaseRequest) -> dict[str, Decimal]:
    """The request's ``mu`` and ``rho``, those that were given."""
    return {name: value for name, value in (("mu", body.mu), ("rho", body.rho)) if value}


def request_hash(dataset_id: uuid.UUID, body: ReleaseRequest) -> str:
    """Fingerprint of a request, to tell an idempotent retry from a different request."""
    canonical = json.dumps(
        {
            "dataset_id": str(dataset_id),
            "mechanism": body.mechanism,
            "k": body.k,
            "epsilon": _canonical(body.epsilon),
            "delta": _canonical(body.delta),
            "params": body.params,
            # Only when given, so that a request in (epsilon, delta) hashes as before.
            **{name: canonical_decimal(value) for name, value in given_currency(body).items()},
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


#: A dataset, locked (built once, with a bound id: every release request runs it).
_LOCK_DATASET = select(Dataset).where(Dataset.id == bindparam("dataset_id")).with_for_update()


def _lock_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    # FOR UPDATE on PostgreSQL; on SQLite the transaction already holds the write lock.
    dataset = session.execute(_LOCK_DATASET, {"dataset_id": dataset_id}).scalar_one_or_none()
    if dataset is None:
        raise NotFound(f"no dataset {dataset_id}")
    if dataset.deleted_at is not None or dataset.file_name is None:
        raise DatasetGone(f"dataset {dataset_id} was deleted; its rows are gone")
    datasets.require_ready(dataset)
    shown = registration_visibility.shown(dataset, None, utcnow())
    if (shown.n_rows, shown.n_batches) != (dataset.n_rows, dataset.n_batches):
        # A batch by reference that counted but does not show yet: this request is prepared,
        # padded and reads (n_rows_read, batches_read) as if it were still registering, else
        # its n (public to analysts) would tell when a worker ended the batch. Set as the
        # loaded values, not changes: nothing of it is written back.
        set_committed_value(dataset, "n_rows", shown.n_rows)
        set_committed_value(dataset, "n_batches", shown.n_batches)
    return dataset


def lock_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    """The live dataset, locked as a real request locks it; 404 or 409 ``dataset_deleted``."""
    return _lock_dataset(session, dataset_id)


@dataclass(frozen=True)
class Prepared:
    """A request validated by its mechanism from public facts; nothing charged yet."""

    mechanism: Mechanism[Any]
    context: PublicContext
    spec: ReleaseSpec[Any]
    #: The resolved params as stored and shown (JSON values).
    params: dict[str, Any]
    #: The single-release ``(epsilon, delta)`` the mechanism is calibrated to (exact decimals
    #: whose ``float_not_above`` are ``spec.epsilon``/``spec.delta``): what ``basic`` charges.
    epsilon: Decimal
    delta: Decimal
    #: The release's cost from its declared steps in the other currencies.
    costs: accounting.StepCosts
    #: What the ledger is charged, in the dataset's currency.
    charge: ledger.Charge


@dataclass(frozen=True)
class Priced:
    """A request prepared against its dataset, with the budgets a real request is charged to."""

    prior: priors.PublicPrior | None
    #: The analyst's usable grant; ``None``: the key has none (allowed unless grants are
    #: required).
    grant: Grant | None
    prepared: Prepared
    #: The grant's budget (``None`` without a grant), checked first, then the dataset's.
    share: ledger.BudgetState | None
    budget: ledger.BudgetState


def price(
    session: Session,
    principal: Principal,
    dataset: Dataset,
    body: ReleaseRequest,
    settings: Settings,
    persist_prior: bool,
) -> Priced:
    """``body`` prepared and its budgets read, as a real request, its dry run and the search
    for what is admitted all need them: the public prior named or given inline (stored when
    ``persist_prior``, for the worker to read; it costs nothing), the grant's terms read before
    the preparation (a defaulted delta fits them), and a revoked or missing grant refused
    after the request's own checks."""
    prior = priors.resolve(session, principal, body.params, persist=persist_prior)
    grant = grants.current_grant(session, dataset.id, principal.key_id)
    prepared = check_request(body, dataset, settings, prior, grant)
    grant = grants.require_usable(grant, required=settings.grants_required)
    share = None if grant is None else grants.grant_budget(session, grant)
    return Priced(prior, grant, prepared, share, ledger.budget_of(session, dataset))


def _context(dataset: Dataset, memory_limit_bytes: int | None) -> PublicContext:
    return PublicContext(
        n_rows=dataset.n_rows,
        n_cols=dataset.n_cols,
        row_norm_bound=dataset.row_norm_bound,
        memory_limit_bytes=memory_limit_bytes,
        n_units=dataset.n_units if dataset.privacy_unit_column is not None else None,
    )


#: Added to the refusal of a param the default mechanism does not take, when the request named
#: no mechanism: ``auto`` was used, and how to set the param (the clients say the same in their
#: own spelling, ``dpss_client.client.defaulted_mechanism``).
DEFAULTED_MECHANISM_HINT = (
    ' (no "mechanism" was given, so "auto", the default, was used: it takes only the fields '
    'listed; send "mechanism": "analyze_gauss" to set this one)'
)


def defaulted_mechanism_refusal(refusal: InvalidInput) -> InvalidInput:
    """``refusal`` of an unknown param of the defaulted ``auto``, with
    :data:`DEFAULTED_MECHANISM_HINT` after the field's "unknown field"; a typo the message
    already corrects ("did you mean") and any other refusal are left as they are."""
    detail = refusal.detail
    if "unknown field" not in detail or "did you mean" in detail:
        return refusal
    head, _, rest = detail.partition(";")
    field = refusal.field
    return InvalidInput(field, f"{head}{DEFAULTED_MECHANISM_HINT};{rest}"[len(field) + 2 :])


def _prepare(
    body: ReleaseRequest,
    dataset: Dataset,
    memory_limit_bytes: int | None = None,
    prior: priors.PublicPrior | None = None,
    grant: Grant | None = None,
) -> Prepared:
    """Validate the request against the mechanism using public facts only (the worker memory
    limit is public configuration: a mechanism may size a default parameter to it), calibrate
    it (to the request's ``(epsilon, delta)`` as a single release, or to its ``mu``/``rho``)
    and work out its charge in the dataset's currency.

    With a public ``prior`` (:mod:`service.priors`) the mechanism is wrapped to run inside its
    span (:func:`service.prior_projection.on_prior`): prepared, calibrated, previewed and
    charged at ``m`` columns; its params carry the prior's id and digest.

    ``grant``: the active grant the release would be charged to (a revoked one is refused
    later). On ``hybrid`` its filters, not the dataset's, decide the single-release delta a
    request in ``mu`` or ``rho`` is calibrated as and a too-large delta's 422 and suggestion
    (:func:`grant_filters`)."""
    mechanism = get_mechanism(body.mechanism)
    if mechanism is None:
        raise InvalidInput("mechanism", unknown_name(body.mechanism, list(MECHANISMS), "mechanism"))
    mechanism_params, _ = priors.split_params(body.params)
    try:
        params = mechanism.parse_params(mechanism_params)
    except ValidationError as exc:
        invalid = InvalidInput.from_validation(exc, prefix="params")
        if "mechanism" not in body.model_fields_set:
            invalid = defaulted_mechanism_refusal(invalid)
        raise invalid from None
    if prior is not None:
        priors.check_for_release(
            prior, mechanism, dataset.n_cols, body.k, dataset.reference is not None
        )
        mechanism = on_prior(mechanism, prior.matrix, prior.sha256)
    context = _context(dataset, memory_limit_bytes)
    kind = dataset.accounting
    # hybrid admits every mechanism (its filter C, basic, charges any release); which filter
    # can charge a request is a matter of its cost, decided at the budget check.
    if kind != "hybrid" and kind not in mechanism.accountings:
        raise InvalidInput("accounting", release_calibration.not_admitted(mechanism, kind))
    _check_currency(body, kind)
    params = mechanism.for_accounting(kind, params)
    filters = grant_filters(dataset, grant)
    if body.epsilon is not None:
        assert body.delta is not None  # _check_currency
        epsilon, delta = body.epsilon, body.delta
        spec = release_calibration.resolve(
            mechanism,
            context,
            body.k,
            release_calibration.float_not_above(epsilon),
            release_calibration.float_not_above(delta),
            params,
        )
        # Also on basic datasets: the dry run shows what the release would cost in the other
        # currencies (the ledger charges (epsilon, delta) there).
        costs = release_calibration.costs_of(mechanism, context, spec)
    else:
        target_delta = body.delta or Decimal(0)
        if kind == "hybrid" and body.mu is not None:
            # A mu asked on a hybrid dataset is filter A''s currency: the release's GDP mu^2
            # (Gaussian and pure steps), exact (mu has at most 30 places).
            target = BUDGET_CONTEXT.multiply(body.mu, body.mu)
            measure = _gdp_of
        else:
            rho = body.rho if body.mu is None else accounting.rho_of_mu_exact(body.mu)
            assert rho is not None  # _check_currency
            target, measure = rho, _rho_of
        epsilon, delta, spec, costs = release_calibration.calibrate(
            mechanism, context, body, params, dataset, target, target_delta, measure, filters
        )
    if kind == "gaussian" and not costs.gaussian:
        raise InvalidInput("accounting", release_calibration.not_admitted(mechanism, kind))
    if kind == "zcdp" and costs.rho is None:
        raise InvalidInput("accounting", release_calibration.not_admitted(mechanism, kind))
    if kind == "basic":
        charge = ledger.Charge(epsilon, delta)
    elif kind == "hybrid":
        charge = charges.hybrid_charge(epsilon, delta, costs)

        def charge_at(asked: Decimal) -> ledger.Charge | None:
            # The same request at another delta: at the same single-release epsilon, or
            # calibrated again to the same mu or rho.
            try:
                if body.epsilon is not None:
                    single = (
                        release_calibration.float_not_above(epsilon),
                        release_calibration.float_not_above(asked),
                    )
                    at = release_calibration.resolve(mechanism, context, body.k, *single, params)
                    costs_at = release_calibration.costs_of(mechanism, context, at)
                    return charges.hybrid_charge(epsilon, asked, costs_at)
                eps, dlt, _, at_costs = release_calibration.calibrate(
                    mechanism, context, body, params, dataset, target, asked, measure, filters
                )
            except InvalidInput:
                return None
            return charges.hybrid_charge(eps, dlt, at_costs)

        # A delta no filter's whole share could take: a 422 with the largest that fits, not
        # a 409 on a fresh budget (the dry run says the same: it prepares through here).
        refusal = charges.hybrid_delta_refusal(dataset, body.delta, charge, charge_at, filters)
        if refusal is not None:
            raise refusal
    else:
        assert costs.rho is not None and costs.delta is not None
        charge = ledger.Charge(Decimal(0), costs.delta, costs.rho)
    dumped: dict[str, Any] = spec.params.model_dump(mode="json")
    if prior is not None:
        dumped.update(prior.recorded())
    return Prepared(
        mechanism=mechanism,
        context=context,
        spec=spec,
        params=dumped,
        epsilon=epsilon,
        delta=delta,
        costs=costs,
        charge=charge,
    )


def grant_filters(dataset: Dataset, grant: Grant | None) -> accounting.HybridBudget | None:
    """On a ``hybrid`` dataset, the filters of the active ``grant`` a release is charged to
    (:func:`service.grants.hybrid_grant_budget`, each within the dataset's); ``None`` without
    one (the dataset's filters apply) or on another accounting."""
    if dataset.accounting != "hybrid" or grant is None or grant.revoked_at is not None:
        return None
    return grants.hybrid_grant_budget(dataset, grant.epsilon, grant.delta)


def _gdp_of(costs: accounting.StepCosts) -> Decimal | None:
    return costs.gdp


def _rho_of(costs: accounting.StepCosts) -> Decimal | None:
    return costs.rho


def _check_currency(body: ReleaseRequest, kind: str) -> None:
    """Exactly one way of stating the cost, and one the dataset's accounting takes."""
    if body.epsilon is not None:
        for name in given_currency(body):
            raise InvalidInput(name, f'give "{name}" or "epsilon", not both')
        if body.delta is None:
            raise InvalidInput("delta", 'required with "epsilon"')
        return
    if body.mu is None and body.rho is None:
        # delta is optional beside epsilon (default_delta fills it before this check), so the
        # message asks for epsilon alone and says what an omitted delta becomes. Field names
        # are quoted as JSON: the clients respell them as their options (dpss_client.spelling).
        needs = {
            "basic": '"epsilon"',
            "gaussian": '"mu" or "epsilon"',
            "hybrid": '"epsilon", "mu" or "rho"',
        }.get(kind, '"rho" or "epsilon"')
        raise InvalidInput(
            "epsilon",
            f"required: {needs} (the release's cost), "
            'e.g. "epsilon": 0.5; "delta" is optional: without it the release gets '
            "min(1e-6, delta_total / 100) of the dataset's delta",
        )
    if kind == "basic":
        name = "mu" if body.mu is not None else "rho"
        raise InvalidInput(name, 'this dataset\'s accounting is basic: give "epsilon" and "delta"')
    if body.mu is not None and body.rho is not None:
        raise InvalidInput("mu", 'give "mu" or "rho", not both')
    if kind == "zcdp" and body.mu is not None:
        raise InvalidInput("mu", 'this dataset\'s accounting is zcdp: give "rho" (and "delta")')
    if kind == "gaussian" and body.rho is not None:
        raise InvalidInput("rho", 'this dataset\'s accounting is gaussian: give "mu"')


def check_memory(prepared: Prepared, limit_mb: float, extra_bytes: int = 0) -> None:
    """Refuse a release whose working memory, a function of public facts, exceeds the limit.

    Checked before charging: a worker that ran out of memory would turn a public refusal into a
    charged ``failed`` release, and memory that depends on the data would be a side channel.
    """
    context = prepared.context
    if prepared.mechanism.continual:
        # Later batches are not known yet: the chunked Gram pass's worst case, a full chunk.
        context = replace(context, n_rows=max(context.n_rows, DEFAULT_CHUNK_ROWS))
    estimate = prepared.mechanism.memory_bytes(context, prepared.spec) + extra_bytes
    limit = limit_mb * MIB
    if estimate > limit:
        ctx = prepared.context
        raise InvalidInput(
            "params",
            f"{prepared.mechanism.name} would need about {size_text(estimate)} of working "
            f"memory for n={ctx.n_rows}, d={ctx.n_cols}, k={prepared.spec.k} and these params, "
            f"above the worker limit of {size_text(limit)} (DPSS_WORKER_MEMORY_MB); "
            "ask for a smaller k or cheaper params, or ask the operator to raise the limit",
        )


def check_request_fields(principal: Principal, body: ReleaseRequest) -> None:
    """The checks of a request that need no dataset: role and storable costs."""
    require_role(principal, "analyst")
    for name, value in (("epsilon", body.epsilon), ("delta", body.delta)):
        if value is not None:
            _check_places(name, value)
    for name, value in given_currency(body).items():
        _check_places(name, value)


def check_request(
    body: ReleaseRequest,
    dataset: Dataset,
    settings: Settings,
    prior: priors.PublicPrior | None = None,
    grant: Grant | None = None,
) -> Prepared:
    """Every refusal a request gets from its dataset's public facts before the budget check:
    mechanism, params (via ``prepare``: clip norm, k, ...), the prior and the memory gate.
    ``grant`` (:func:`service.grants.current_grant`) bounds a defaulted delta.

    A defaulted delta is for releases that spend one: on ``hybrid`` a release whose declared
    steps are all pure (``smooth_sensitivity``'s Cauchy variant) is prepared at delta 0, as if
    asked so (:func:`_without_unused_delta`)."""
    defaulted = body.epsilon is not None and body.delta is None
    body = with_default_delta(body, dataset, grant)
    chosen = get_mechanism(body.mechanism)
    if defaulted and body.delta is not None and chosen is not None and not chosen.allows_pure_dp:
        refuse_zero_default(chosen.name, body.delta, dataset, grant)
    extra = 0
    if dataset.reference is not None:
        reference.mechanism_allowed(body.mechanism)
        extra = reference.worker_bytes(dataset.reference)
    person_level = dataset.privacy_unit_column is not None
    if person_level:
        # The mechanism first, so its refusal names the unit rather than one of its params.
        mechanism = get_mechanism(body.mechanism)
        if mechanism is not None:
            privacy_unit.check_mechanism(mechanism.name, None, mechanism.continual)
            privacy_unit.check_auto_delta(mechanism.name, body.delta)
    memory = int(settings.worker_memory_mb * MIB)
    prepared = _prepare(body, dataset, memory, prior, grant)
    if defaulted:
        prepared = _without_unused_delta(prepared, body, dataset, memory, prior, grant)
    if person_level:
        # A person-level dataset: only mechanisms with a person-level argument, a partition of
        # people with a person in each subset, and the worker's per-person bound
        # (privacy_unit.bound_contributions) or partition of people in the memory gate.
        name = prepared.mechanism.name
        privacy_unit.check_mechanism(name, prepared.spec.params, prepared.mechanism.continual)
        privacy_unit.check_partition(name, prepared.spec.params, dataset.n_units or 0)
        extra += privacy_unit.extra_bytes(
            name, dataset.n_rows, dataset.n_cols, prepared.spec.params
        )
    check_memory(prepared, settings.worker_memory_mb, extra)
    return prepared


def _without_unused_delta(
    prepared: Prepared,
    body: ReleaseRequest,
    dataset: Dataset,
    memory_limit_bytes: int,
    prior: priors.PublicPrior | None,
    grant: Grant | None,
) -> Prepared:
    """``prepared`` again at delta 0 when its delta was defaulted, the dataset is ``hybrid``
    and every declared step is pure: such a release is ``(epsilon, 0)``-DP (its pure steps'
    epsilons sum to at most the epsilon it is calibrated to), and hybrid's filter C charges the
    ``(epsilon, delta)`` a release is calibrated as. The default, a hundredth of
    ``delta_total``, is all of C's 1% share: charged for a delta the release never spends, it
    closed C after one pure release (A' and B charge a pure epsilon dearly: pure_mu(0.3)^2 =
    0.141 against A''s 0.0715 on a ``(1, 1e-5)`` dataset), so one release at epsilon 0.3 ended
    what ``basic`` would have let run three times. Kept as prepared if the mechanism refuses
    delta 0 or is no longer pure there (public facts only, nothing charged yet)."""
    costs = prepared.costs
    if dataset.accounting != "hybrid" or not costs.pure or prepared.delta == 0:
        return prepared
    try:
        again = _prepare(
            body.model_copy(update={"delta": Decimal(0)}),
            dataset,
            memory_limit_bytes,
            prior,
            grant,
        )
    except InvalidInput:
        return prepared
    return again if again.costs.pure and again.delta == 0 else prepared


def _idempotent_match(
    session: Session, principal: Principal, idempotency_key: str | None, fingerprint: str
) -> Release | None:
    """The release an earlier request with this key made, if the request is the same one."""
    if idempotency_key is None:
        return None
    existing = session.execute(
        select(Release).where(
            Release.requester_key_id == principal.key_id,
            Release.idempotency_key == idempotency_key,
        )
    ).scalar_one_or_none()
    if existing is not None and existing.request_hash != fingerprint:
        raise IdempotencyConflict(IDEMPOTENCY_KEY_REUSED)
    return existing


def _padding(
    session: Session,
    settings: Settings,
    mechanism: str,
    dataset: Dataset,
    k: int,
    params: dict[str, Any],
    now: datetime,
) -> timedelta:
    """This release's padding from public facts fixed at ``now`` only (each input and why it
    is public: :mod:`service.padding`): its shape and params, the machine's calibrated rates
    (:mod:`service.calibration`) and the shapes and params of the one-shot releases requested
    by ``now`` and not yet past their own ``visible_at`` (their modelled run times). Never a
    real status, lease, start or finish: the padding of a probe release is the same whether
    another job is still queued, running or already ended."""
    model = padding_model(session, settings, now)
    queue = request_queue_seconds(session, settings, model, now)
    return model.padding(mechanism, dataset.n_rows, dataset.n_cols, k, params, queue)


def request_release(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    idempotency_key: str | None,
    settings: Settings,
) -> Release:
    """Queue a release and charge its cost, or refuse without charging anything.

    ``visible_at`` is fixed here, from public facts only, so that when an analyst may see the
    outcome says nothing about how long the job ran (see :mod:`service.padding`).
    """
    return queue_release(session, principal, dataset_id, body, idempotency_key, settings)[0]


def queue_release(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    idempotency_key: str | None,
    settings: Settings,
) -> tuple[Release, Dataset | None]:
    """:func:`request_release`, and the dataset row it locked (``None`` when an earlier
    request with the same idempotency key answered before the lock).

    Why the row: a caller that reads the release in the same transaction (``POST ?wait=``'s
    first read, :func:`service.visibility.view`) finds the dataset in the session only while
    something holds it (the session's identity map holds rows weakly), and selected it again
    otherwise: a statement per release (``bench/bench_release_cpu.py``)."""
    check_request_fields(principal, body)
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
        raise InvalidInput("Idempotency-Key", "must be 1 to 200 characters")
    if idempotency_key is not None and KEY_PREFIX in idempotency_key.lower():
        # It would be stored with the release (and in every backup): an API key pasted here
        # by mistake must not be.
        raise InvalidInput(
            "Idempotency-Key", f"must not contain an API key ('{KEY_PREFIX}...'); send a UUID"
        )
    fingerprint = request_hash(dataset_id, body)
    existing = _idempotent_match(session, principal, idempotency_key, fingerprint)
    if existing is not None:
        return existing, None
    dataset = _lock_dataset(session, dataset_id)
    # Again under the lock: a concurrent retry of the same request may have committed meanwhile.
    existing = _idempotent_match(session, principal, idempotency_key, fingerprint)
    if existing is not None:
        return existing, dataset
    # In the commit order (service.commit_order) from here, after the dataset's row and before
    # the audit head (an inline prior's event below): its stamp comes later.
    commit_order.hold(session)
    # A prior given inline is stored now (rolled back with the request if it is refused).
    priced = price(session, principal, dataset, body, settings, persist_prior=True)
    grant, prepared, share, budget = priced.grant, priced.prepared, priced.share, priced.budget
    params = prepared.params
    # The grant is checked first: it is the analyst's own limit, and naming it is more useful
    # than the dataset's remainder when both are short. Both under the dataset's lock.
    # The epsilon this request is admitted at is not searched here, under the dataset's lock
    # (it prepares the request a dozen times): :func:`admissible_search` reads what it
    # needs after this transaction and searches outside any; the route adds it to the 409.
    if share is not None and not share.affords(prepared.charge):
        raise budget_exceeded(
            share,
            prepared.charge,
            budget="grant",
            grant_id=grant.id if grant else None,
            unit=privacy_unit.unit_of(dataset),
        )
    if not budget.affords(prepared.charge):
        raise budget_exceeded(budget, prepared.charge, unit=privacy_unit.unit_of(dataset))
    # Stamped in the commit order (service.commit_order): a term for a later point, however
    # late the worker computes it, sees this release.
    created_at = commit_order.stamp(session, held=True)  # held since the lock
    padding = _padding(
        session, settings, prepared.mechanism.name, dataset, body.k, params, created_at
    )
    release = Release(
        id=uuid.uuid4(),
        dataset_id=dataset.id,
        requester_key_id=principal.key_id,
        mechanism=prepared.mechanism.name,
        k=body.k,
        epsilon=prepared.epsilon,
        delta=prepared.delta,
        cost_rho=charges.cost_rho(dataset.accounting, prepared.charge),
        cost_delta=charges.cost_delta(dataset.accounting, prepared.charge),
        params=params,
        idempotency_key=idempotency_key,
        request_hash=fingerprint,
        status="queued",
        attempts=0,
        refunded=False,
        created_at=created_at,
        visible_at=created_at + padding,
        # The request's trace (when tracing is on), continued by the worker that runs it.
        traceparent=tracing.current_traceparent(),
    )
    if not prepared.mechanism.continual:
        # The rows a one-shot release reads: the batches present now, whose public n its
        # parameters were prepared with (later appends are not read).
        release.n_rows_read = dataset.n_rows
        release.batches_read = dataset.n_batches
    # Written at once (its charge's entry names it), not flushed by the ORM: release_rows.
    if idempotency_key is None:
        # Nothing unique to race on (no key): no savepoint around the insert.
        insert_release(session, release)
    else:
        try:
            with session.begin_nested():
                insert_release(session, release)
        except IntegrityError:
            # The same key raced in for another dataset (a different request): refuse, charge
            # nothing.
            raise IdempotencyConflict(IDEMPOTENCY_KEY_REUSED) from None
    grant_id = grant.id if grant is not None else None
    ledger.charge(session, dataset.id, release.id, prepared.charge, grant_id)
    audit.record(
        session,
        "release_requested",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        release_id=release.id,
        details={
            "mechanism": prepared.mechanism.name,
            "k": body.k,
            "params": params,
            "cost": cost_details(dataset.accounting, prepared),
            "grant_id": grant_id,
            **privacy_unit.event_details(dataset),
        },
    )
    # Idle workers learn of the job when this transaction commits (a hint: they also poll).
    wake.announce(session, settings)
    return release, dataset


def cost_details(kind: str, prepared: Prepared) -> dict[str, Any]:
    """A release's cost as its audit events record it (:func:`service.charges.details`)."""
    return charges.details(kind, prepared.epsilon, prepared.delta, prepared.charge)


def budget_exceeded(
    state: ledger.BudgetState,
    charge: ledger.Charge,
    budget: str = "dataset",
    grant_id: uuid.UUID | None = None,
    unit: str = "row",
) -> BudgetExceeded:
    """The 409 for a budget the charge does not fit, with what remains stated as
    ``GET .../budget`` (or the grant) states it (:func:`service.spend.statement`), in the
    dataset's privacy ``unit`` as that does, and what the charge lacks
    (:meth:`~service.ledger.BudgetState.shortfalls`); what the same request is admitted at is
    added after the transaction (:func:`admissible_search`)."""
    return BudgetExceeded(
        spend.statement(state).remaining_fields(),
        budget=budget,
        grant_id=grant_id,
        shortfalls=state.shortfalls(charge),
        privacy_unit=unit,
        accounting=state.accounting,
    )


def admissible_search(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    settings: Settings,
) -> Callable[[], repricing.Admissible] | None:
    """What ``body`` is admitted at now (:mod:`service.repricing`), read now as a search to run
    after this transaction; ``None`` when it is admitted as asked or asked in ``mu`` or ``rho``.

    The search prepares the request again at each trial epsilon, at the delta it was prepared
    at (a defaulted one included), else at another (:func:`repricing.admissible_delta`), and
    checks each against the grant's budget (if any) and the dataset's. A refused request or an
    unaffordable dry run has already answered under the dataset's lock; the search (about
    1.5 s for ``auto`` on a loaded machine) must not hold that lock, nor on SQLite the write
    lock every transaction takes, nor a database slot: it reads here (no lock) and runs on what
    was read, outside any transaction. A figure read a moment after the refusal is what
    "admitted now" can mean: any later release changes it."""
    asked_epsilon = body.epsilon
    if asked_epsilon is None:
        return None
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or dataset.deleted_at is not None or dataset.file_name is None:
        return None
    # Prepared once here, so every attribute the trials read is loaded before the session ends.
    priced = price(session, principal, dataset, body, settings, persist_prior=False)
    charge = priced.prepared.charge
    budgets = [priced.budget] if priced.share is None else [priced.share, priced.budget]
    if all(budget.affords(charge) for budget in budgets):
        return None

    def prepare(trial: ReleaseRequest) -> ledger.Charge:
        return check_request(trial, dataset, settings, priced.prior, priced.grant).charge

    def at_delta(delta: Decimal) -> repricing.ChargeAtEpsilon:
        return repricing.charge_at_epsilon(prepare, body.model_copy(update={"delta": delta}))

    def search() -> repricing.Admissible:
        asked_delta = Decimal(priced.prepared.delta)
        epsilon = repricing.admissible_epsilon(asked_epsilon, at_delta(asked_delta), budgets)
        if epsilon is not None:
            return repricing.Admissible(epsilon=epsilon, asked_delta=asked_delta)
        grid = repricing.delta_grid(asked_delta, priced.prepared.mechanism.allows_pure_dp)
        found = repricing.admissible_delta(asked_epsilon, at_delta, grid, budgets)
        if found is None:
            return repricing.Admissible()
        return repricing.Admissible(delta=found[0], delta_epsilon=found[1], asked_delta=asked_delta)

    return search


def get_release(session: Session, principal: Principal, release_id: uuid.UUID) -> Release:
    """Analysts read the releases they requested; owners those of their datasets."""
    require_role(principal, "analyst", "owner")
    release = read_release(session, release_id)
    if release is not None:
        if principal.role == "analyst":
            visible = release.requester_key_id == principal.key_id
        else:
            dataset = session.get(Dataset, release.dataset_id)
            visible = dataset is not None and dataset.owner_key_id == principal.key_id
        if visible:
            return release
    raise NotFound(f"no release {release_id}")


def shows_timing(principal: Principal) -> bool:
    """Whether ``principal`` sees start and finish times and attempt counts: run time and
    retries can depend on the data, and a release's start tells when the job ahead of it in
    the queue (on any dataset) ended, so analysts and owners do not
    (:func:`service.auth.sees_real_state`)."""
    return sees_real_state(principal)


def decode_basis(
    data: bytes | None, shape: list[int] | None
) -> np.ndarray[Any, np.dtype[np.float64]] | None:
    """A stored basis (``release_bases.basis``) as a ``d x k`` array."""
    if data is None or shape is None:
        return None
    rows, cols = shape
    return np.frombuffer(data, dtype="<f8").reshape(rows, cols)


def stored_basis(session: Session, release: Release) -> bytes | None:
    """The release's result basis (read only to be shown: see :class:`ReleaseBasis`)."""
    found = session.get(ReleaseBasis, (release.id, 0))
    return found.basis if found is not None else None


def encode_basis(basis: np.ndarray[Any, Any]) -> tuple[bytes, list[int], str]:
    """Bytes (little-endian float64, row-major), shape and SHA-256 of a basis."""
    data = np.ascontiguousarray(basis, dtype="<f8").tobytes()
    return data, [int(basis.shape[0]), int(basis.shape[1])], hashlib.sha256(data).hexdigest()
