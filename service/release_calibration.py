"""A release's spec and its declared cost: a mechanism's params resolved at ``(epsilon, delta)``,
and a cost asked for in a dataset's own currency (rho, or GDP ``mu``) calibrated to the largest
single-release ``(epsilon, delta)`` whose declared cost fits it.

Every input is public (the request, the dataset's public shape and budget); nothing here reads
a row. The ledger charges exactly the :class:`~service.accounting.StepCosts` returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import ROUND_FLOOR, Context, Decimal
from typing import Any

from api_schemas.common import BUDGET_CONTEXT
from api_schemas.releases import ReleaseRequest
from service import accounting
from service.db.models import Dataset
from service.errors import InvalidInput
from service.mechanisms.base import InvalidParameter, Mechanism, PublicContext, ReleaseSpec


def float_not_above(value: Decimal) -> float:
    """The largest double that is ``<= value``: a mechanism never runs with more epsilon or
    delta than the ledger charged (``float()`` alone may round up by half an ulp)."""
    result = float(value)
    return math.nextafter(result, -math.inf) if Decimal(result) > value else result


def resolve(
    mechanism: Mechanism[Any],
    context: PublicContext,
    k: int,
    epsilon: float,
    delta: float,
    params: Any,
) -> ReleaseSpec[Any]:
    """``prepare`` at ``(epsilon, delta)``; :class:`InvalidInput` names the field."""
    try:
        resolved = mechanism.prepare(context, k, epsilon, delta, params)
    except InvalidParameter as exc:
        field = exc.field if exc.field in {"k", "epsilon", "delta"} else f"params.{exc.field}"
        raise InvalidInput(field, exc.message) from None
    return ReleaseSpec(k=k, epsilon=epsilon, delta=delta, params=resolved)


def costs_of(
    mechanism: Mechanism[Any], context: PublicContext, spec: ReleaseSpec[Any]
) -> accounting.StepCosts:
    return accounting.step_costs(mechanism.privacy_steps(context, spec))


#: Significant digits of a calibrated single-release epsilon (the ledger keeps it exactly).
CALIBRATION_DIGITS = 15
#: The range a calibrated single-release epsilon is searched in.
CALIBRATION_RANGE = (1e-9, 1e5)


def _decimal_down(value: float) -> Decimal:
    """``value`` rounded down to :data:`CALIBRATION_DIGITS` significant digits."""
    exponent = math.floor(math.log10(value)) - CALIBRATION_DIGITS + 1
    return Decimal(value).quantize(Decimal(1).scaleb(exponent), rounding=ROUND_FLOOR)


def calibrate(
    mechanism: Mechanism[Any],
    context: PublicContext,
    body: ReleaseRequest,
    params: Any,
    dataset: Dataset,
    target_rho: Decimal,
    target_delta: Decimal,
    measure: Callable[[accounting.StepCosts], Decimal | None] = lambda costs: costs.rho,
    grant_filters: accounting.HybridBudget | None = None,
) -> tuple[Decimal, Decimal, ReleaseSpec[Any], accounting.StepCosts]:
    """The largest single-release epsilon (at the delta below) whose declared cost is within
    ``(target_rho, target_delta)``: the release asked for in the dataset's currency.
    ``measure`` reads the cost compared with ``target_rho``: ``rho`` (default), or on a
    ``hybrid`` dataset asked for ``mu``, the release's GDP ``mu^2`` (``target_rho`` is then
    ``mu^2``; it grows with epsilon as ``rho`` does).

    The delta: for a purely Gaussian release any delta reaches every rho (only
    ``epsilon``'s search moves the noise), so the dataset's ``delta_total`` is used and the
    release reads as a single ``(epsilon, delta_total)`` release (on ``hybrid``, a tenth of
    filter C's share of delta: the dataset's, or with ``grant_filters`` the grant's the
    release is charged to, :func:`service.releases.grant_filters`); a release with approximate
    steps spends a fixed fraction of its delta on them, so its delta is that fraction's inverse
    times ``target_delta``. The declared rho increases with epsilon: bisection on ``log eps``.
    Every candidate is an exact decimal whose ``float_not_above`` is what the worker runs with.
    """
    field = "mu" if body.mu is not None else "rho"

    def attempt(eps: Decimal, delta: Decimal) -> tuple[ReleaseSpec[Any], accounting.StepCosts]:
        spec = resolve(
            mechanism, context, body.k, float_not_above(eps), float_not_above(delta), params
        )
        return spec, costs_of(mechanism, context, spec)

    delta = dataset.delta_total
    basic_share = dataset.delta_basic if grant_filters is None else grant_filters.delta_basic
    if dataset.accounting == "hybrid" and basic_share:
        # Any delta reaches every target for a Gaussian release, and the (epsilon, delta) it is
        # calibrated as is what hybrid's filter C (basic, on its small share of delta) is
        # charged: at a tenth of C's share, C can still admit later releases (at delta_total
        # one such release would close C for good). The noise is the same either way. Under a
        # grant, the grant's C share: a tenth of the dataset's can be more than the grant's
        # whole share, and would close the grant's C for good.
        delta = accounting.round_down(BUDGET_CONTEXT.divide(basic_share, 10))
    probe = _probe(attempt, delta)
    if measure(probe) is None:
        if dataset.accounting == "hybrid":
            raise InvalidInput(
                "mu",
                f"{mechanism.name} has steps the GDP filter cannot charge with these params: "
                "give epsilon and delta (or rho and delta) instead",
            )
        raise InvalidInput("accounting", not_admitted(mechanism, dataset.accounting))
    if probe.delta:
        if not target_delta:
            raise InvalidInput(
                "delta",
                f"{mechanism.name} has approximate steps: give the delta they may spend with rho",
            )
        fraction = BUDGET_CONTEXT.divide(probe.delta, delta) if delta else Decimal(1)
        delta = accounting.round_down(Context(prec=60).divide(target_delta, fraction))
        for _ in range(8):
            if not 0 < delta < 1:
                raise InvalidInput("delta", "too large for this mechanism's approximate steps")
            costs = _probe(attempt, delta)
            if costs.delta is not None and costs.delta <= target_delta:
                break
            delta = accounting.round_down(BUDGET_CONTEXT.multiply(delta, Decimal("0.999999")))
    elif target_delta:
        raise InvalidInput("delta", f"{mechanism.name} is purely Gaussian: it spends no delta")

    def fits(
        eps: float, delta: Decimal, check_delta: bool = True
    ) -> tuple[ReleaseSpec[Any], accounting.StepCosts, Decimal] | None:
        """The prepared release at ``eps`` if its cost is within the target, else ``None``.
        A refusal by ``prepare`` propagates: the caller treats it as a budget too small for
        the mechanism's params (their refusals are of too little budget: t, PTR floors).
        Both the rho and the approximate delta grow with epsilon (a Laplace test's delta is
        ``e^eps1 delta1``), so the condition is monotone."""
        candidate = _decimal_down(eps)
        spec, costs = attempt(candidate, delta)
        measured = measure(costs)
        if measured is None or measured > target_rho:
            return None
        over = target_delta and costs.delta is not None and costs.delta > target_delta
        if check_delta and over:
            return None
        return spec, costs, candidate

    def search(
        delta: Decimal, check_delta: bool = True, tolerance: float = 1e-14
    ) -> tuple[tuple[ReleaseSpec[Any], accounting.StepCosts, Decimal] | None, InvalidInput | None]:
        low, high = math.log(CALIBRATION_RANGE[0]), math.log(CALIBRATION_RANGE[1])
        best: tuple[ReleaseSpec[Any], accounting.StepCosts, Decimal] | None = None
        refusal: InvalidInput | None = None
        for _ in range(100):
            if high - low < tolerance:
                break
            mid = (low + high) / 2
            try:
                found = fits(math.exp(mid), delta, check_delta)
            except InvalidInput as exc:
                # Refused at this epsilon: too little budget for the params; look higher.
                refusal, low = exc, mid
                continue
            if found is None:
                high = mid
            else:
                best, low = found, mid
        return best, refusal

    best, refusal = search(delta)
    if best is not None and probe.delta and target_delta:
        # The approximate steps' delta may grow with epsilon (a PTR test's common event:
        # e^eps1 delta1, Phi(mu1 - z)), so at the delta first tried it may bind long before
        # rho does. Fixed point: where rho binds, rescale delta so that the approximate delta
        # meets its target there; a few rounds, then the checked search at the delta reached.
        # Whatever is kept satisfies both targets (fits checks both).
        trial = delta
        for _ in range(6):
            # a coarser epsilon (1e-6 relative) is enough to steer delta
            at_rho, _ = search(trial, check_delta=False, tolerance=1e-6)
            at = None if at_rho is None else at_rho[1].delta
            if at is None or at <= 0:
                break
            # shaded by 1e-5 so that delta lands just under its target and rho binds
            ratio = Context(prec=60).divide(target_delta * Decimal("0.99999"), at)
            trial = accounting.round_down(Context(prec=60).multiply(trial, ratio))
            if not 0 < trial < 1 or abs(ratio - 1) < Decimal("1e-4"):
                break
        if 0 < trial < 1 and trial != delta:
            again, _ = search(trial)
            again_measured = None if again is None else measure(again[1])
            best_measured = measure(best[1])
            gained = (
                again_measured is not None
                and best_measured is not None
                # as much rho (to the search's resolution), and delta nearer its target
                and again_measured >= best_measured * Decimal("0.999999")
            )
            if gained:
                assert again is not None
                best, delta = again, trial
    if best is None:
        raise (
            refusal
            if refusal is not None
            else InvalidInput(field, "too small for this mechanism and dataset")
        )
    spec, costs, eps = best
    return eps, delta, spec, costs


def _probe(
    attempt: Callable[[Decimal, Decimal], tuple[ReleaseSpec[Any], accounting.StepCosts]],
    delta: Decimal,
) -> accounting.StepCosts:
    """The costs at some single-release epsilon the mechanism accepts (its step kinds and the
    share of delta its approximate steps spend do not depend on which)."""
    error: InvalidInput | None = None
    for epsilon in ("1", "10", "100", "0.1"):
        try:
            return attempt(Decimal(epsilon), delta)[1]
        except InvalidInput as exc:
            error = exc
    assert error is not None
    raise error


def not_admitted(mechanism: Mechanism[Any], accounting_name: str) -> str:
    if accounting_name == "hybrid":
        return (
            f"{mechanism.name} has no proven zCDP profile with these params, so it cannot be "
            "asked in rho (this dataset's filter B); give epsilon and delta instead (filter C, "
            "basic, charges any release); see docs/mechanisms.md, 'Accounting across releases'"
        )
    if accounting_name == "gaussian":
        return (
            f"{mechanism.name} has steps that are not Gaussian with these params, so this "
            "dataset's gaussian accounting (a Gaussian-DP filter) cannot charge it: a pure or "
            "approximate step is not admitted there, as no fully adaptive theorem for a GDP "
            "filter mixing such steps is cited; only analyze_gauss, spectrum, continual_gauss "
            "and auto (without its tests) run here (docs/mechanisms.md, 'Accounting across "
            "releases')"
        )
    return (
        f"{mechanism.name} has no proven zCDP profile with these params, so this dataset's "
        "zcdp accounting cannot charge it (never at a guessed rate); see docs/mechanisms.md, "
        "'Accounting across releases'"
    )
