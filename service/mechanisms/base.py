"""The contract every mechanism implements.

A release goes through two steps:

1. :meth:`Mechanism.prepare` sees only public facts (``n``, ``d``, the declared row norm bound,
   the request) and either resolves the parameters or raises :class:`InvalidParameter`. It runs
   in the API process before anything is charged, so a refusal costs nothing.
2. :meth:`Mechanism.run` reads the data in a worker and returns a :class:`MechanismOutput`.

The privacy cost of a release is the request's ``(epsilon, delta)``: each mechanism splits it
internally into fixed fractions, so the cost is known before the mechanism runs.

Costs in the other currencies (``service.accounting``): a mechanism whose privacy argument is a
sequence of steps of known kinds declares them with :meth:`Mechanism.privacy_steps`, from the
prepared spec (public facts) alone: a Gaussian step of sensitivity ``D`` and noise ``sigma`` is
``D/sigma``-GDP and ``D^2/(2 sigma^2)``-zCDP; a pure ``eps``-step is ``eps^2/2``-zCDP; a step
that is ``eps``-DP outside an event of probability ``delta`` is ``delta``-approximately
``eps^2/2``-zCDP. Steps compose by summing ``rho`` and ``delta`` (``mu^2`` for all-Gaussian
releases). A mechanism that declares none is admitted only by ``basic`` accounting.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from pydantic import ConfigDict, Field
from scipy.special import ndtr, ndtri

from api_schemas.common import NamesValidFields
from service.mechanisms.linalg import FloatArray
from service.mechanisms.noise import LARGEST_EXP_ARGUMENT


class InvalidParameter(ValueError):
    """A request a mechanism refuses before it runs; ``field`` names the offending parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class MechanismParams(NamesValidFields):
    """Base of every params schema: unknown keys are refused rather than silently ignored (the
    refusal names the valid keys and the nearest), and values are strict (JSON ``true`` is not
    the integer 1, ``"2"`` is not a number)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ClipParams(MechanismParams):
    """Params of mechanisms that clip rows to a public norm bound."""

    clip_norm: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Public row norm bound C; rows are scaled to norm at most C. Defaults to the "
            "dataset's row_norm_bound. Never computed from the data."
        ),
    )


P = TypeVar("P", bound=MechanismParams)
CP = TypeVar("CP", bound=ClipParams)


#: Working memory a release may use when the context does not say (the default of
#: ``DPSS_WORKER_MEMORY_MB``, 6144 MiB): mechanisms that size a parameter to memory use it.
DEFAULT_MEMORY_LIMIT_BYTES = 6144 * 1024 * 1024


@dataclass(frozen=True)
class PublicContext:
    """What is public about a dataset: its shape and the owner's declared row norm bound; and
    the operator's worker memory limit (bytes; ``None``: :data:`DEFAULT_MEMORY_LIMIT_BYTES`),
    which a mechanism may use to size a default parameter (it is public configuration)."""

    n_rows: int
    n_cols: int
    row_norm_bound: float | None
    memory_limit_bytes: int | None = None
    #: People on a dataset with ``privacy_unit_column`` (public like ``n_rows``), else ``None``:
    #: ``auto`` keeps only candidates that can bound a person (issue 34).
    n_units: int | None = None

    @property
    def memory_limit(self) -> int:
        """The worker memory limit in bytes."""
        if self.memory_limit_bytes is None:
            return DEFAULT_MEMORY_LIMIT_BYTES
        return self.memory_limit_bytes


@dataclass(frozen=True)
class ReleaseSpec(Generic[P]):
    """Everything a mechanism runs with besides the data and the generator; all public."""

    k: int
    epsilon: float
    delta: float
    params: P


@dataclass
class MechanismOutput:
    """What a run produced.

    ``basis`` is ``d x k`` with orthonormal columns, or ``None`` (no result, or a mechanism such
    as ``spectrum`` that releases no basis). ``extras`` holds further private outputs (JSON
    values). ``no_result_reason`` is set exactly when the mechanism declined to release; that
    outcome is itself a private output and is charged.
    """

    basis: FloatArray | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    no_result_reason: str | None = None

    @classmethod
    def no_result(cls, reason: str, **extras: Any) -> MechanismOutput:
        return cls(basis=None, extras=dict(extras), no_result_reason=reason)


#: A preview's named quantities: numbers, or words for a choice (e.g. a noise variant).
PreviewValue = float | int | str | bool | None


@dataclass(frozen=True)
class Preview:
    """What a release would use, from public facts only (see :meth:`Mechanism.preview`).

    ``scales`` names each noise scale, threshold and count the run would use (the same
    functions compute them there); ``meaning`` says in plain words what they imply.
    """

    scales: dict[str, PreviewValue]
    meaning: list[str]


@dataclass(frozen=True)
class GaussianStep:
    """Gaussian noise of standard deviation ``sigma`` on a query of l2 sensitivity
    ``sensitivity`` (only the ratio matters: a data-dependent sensitivity bound, as in a PTR
    release, may be declared as ``1`` and ``sigma/sensitivity``)."""

    sensitivity: float
    sigma: float


@dataclass(frozen=True)
class PureStep:
    """A step that is ``epsilon``-DP (Laplace, AboveThreshold, exponential mechanism)."""

    epsilon: float


@dataclass(frozen=True)
class ApproximateStep:
    """A step that is ``epsilon``-DP outside an event of probability at most ``delta`` (a PTR
    test's failure, truncated Laplace, a stability histogram's unseen cell): ``delta``-
    approximately ``epsilon^2/2``-zCDP. The mechanism's docstring names the event."""

    epsilon: float
    delta: float


PrivacyStep = GaussianStep | PureStep | ApproximateStep


def gaussian_test_event_delta(mu: float, delta: float) -> float:
    """The approximate-zCDP ``delta`` of a propose-test-release test that releases a Gaussian
    lower bound ``L = S + N(0, s^2) - s z`` of a statistic ``S`` of sensitivity ``D = mu s``,
    ``z = Phi^-1(1 - delta)`` (so ``P[L > S] = delta``), when the next step needs ``L <= S``.

    The event is one set of outputs for both neighbours, ``I = {L <= min(S, S')}``; outside it
    each side has mass at most ``P[N(0,1) > z - mu] = Phi(mu - z)``, returned here. On ``I``
    the test stays ``mu``-GDP-like in Renyi divergence: for Gaussians ``P, Q`` of means ``a, b``
    and the half-line ``I``, ``D_alpha(P_I || Q_I) = alpha (a-b)^2/(2 s^2) + ln[P_m(I) /
    (P_a(I)^alpha P_b(I)^(1-alpha))]/(alpha - 1)`` with ``m = alpha a + (1 - alpha) b``; ``m ->
    ln P_m(I)`` is concave (Prekopa: a Gaussian is log-concave, ``I`` convex), and ``a`` is the
    convex combination ``m/alpha + (1 - 1/alpha) b``, so the logarithm is ``<= 0``: the
    conditioned pair is ``mu^2/2``-zCDP, the test's own ``rho``. On ``I`` the next step's
    bound holds for both sides."""
    z = float(-ndtri(delta))
    return float(ndtr(mu - z))


def laplace_test_step(epsilon: float, delta: float) -> ApproximateStep | None:
    """The profile of a propose-test-release test that releases a Laplace lower bound
    ``L = S + Lap(D/eps) - shift`` of a statistic ``S`` of sensitivity ``D``, with ``P[L > S] =
    delta``, when the next step's sensitivity bound needs ``L <= S`` (``gap_perturbation``'s
    ``g_low``, ``friendly_aggregate``'s ``W_low``).

    The event must be one set of outputs for both neighbours (per-side events ``L <= S(x)`` and
    ``L <= S(x')`` give the two conditioned laws different supports, an infinite divergence):
    ``I = {L <= min(S, S')}``. Outside it each side has mass at most ``P[Lap > shift - D] <=
    e^eps delta`` (``shift >= 0``; for ``shift < D`` use ``cosh >= 1``). On ``I`` both laws
    are Laplace densities with ratio at most ``e^{|S - S'|/(D/eps)} <= e^eps``, renormalised by
    ``P[I]`` in ``[1 - e^eps delta, 1]``, so the conditioned pair is ``eps'``-DP both ways with
    ``eps' = eps + ln(1/(1 - e^eps delta))``; and on ``I`` the next step's bound holds for both
    sides. Hence ``e^eps delta``-approximately ``eps'^2/2``-zCDP (Bun & Steinke 2016,
    Definition 8.1, Proposition 1.4). ``None`` (no profile) when ``e^eps delta >= 1/2``."""
    if delta == 0:
        spill = 0.0
    elif epsilon >= LARGEST_EXP_ARGUMENT:
        # e^eps alone overflows (OverflowError) from eps ~ 709.8, below the request's largest
        # epsilon (1000): the product in logs, capped where it is far above 1/2 anyway.
        spill = math.exp(min(epsilon + math.log(delta), LARGEST_EXP_ARGUMENT))
    else:
        spill = math.exp(epsilon) * delta
    if not spill < 0.5:
        return None
    return ApproximateStep(epsilon - math.log1p(-spill), spill)


class Mechanism(ABC, Generic[P]):
    """A differentially private release of a subspace (or of a statistic used to choose one)."""

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    summary: ClassVar[str]
    cost_rule: ClassVar[str] = "Charges exactly the requested (epsilon, delta)."
    params_model: ClassVar[type[MechanismParams]]
    allows_pure_dp: ClassVar[bool] = False
    releases_basis: ClassVar[bool] = True
    #: The accountings whose filter can charge this mechanism: ``basic`` always; ``zcdp`` and
    #: ``gaussian`` only where :meth:`privacy_steps` declares a proven profile (every step
    #: Gaussian for ``gaussian``). A dataset of another accounting refuses it with 422 before
    #: anything is prepared or charged.
    accountings: ClassVar[frozenset[str]] = frozenset({"basic"})
    #: A continual mechanism follows a growing dataset: the worker calls ``start`` once and
    #: ``advance`` per batch (one epoch each) instead of ``run``.
    continual: ClassVar[bool] = False

    def parse_params(self, raw: dict[str, Any]) -> P:
        """Validate the raw ``params`` object against this mechanism's schema."""
        return self.params_model.model_validate(raw)  # type: ignore[return-value]

    def check_common(self, ctx: PublicContext, k: int, epsilon: float, delta: float) -> None:
        """Checks shared by every mechanism; raise :class:`InvalidParameter`."""
        if not epsilon > 0:
            raise InvalidParameter("epsilon", "must be > 0")
        if not 0 <= delta < 1:
            raise InvalidParameter("delta", "must be in [0, 1)")
        if delta == 0 and not self.allows_pure_dp:
            raise InvalidParameter(
                "delta",
                f"{self.name} needs delta > 0 (smooth_sensitivity and auto run with delta = 0)",
            )
        if k < 1:
            raise InvalidParameter("k", "must be >= 1")
        if self.releases_basis and k > ctx.n_cols:
            raise InvalidParameter("k", f"must be <= the number of columns ({ctx.n_cols})")

    def prepare(self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: P) -> P:
        """Resolve defaults from public facts and refuse what cannot run. Never reads data."""
        self.check_common(ctx, k, epsilon, delta)
        return params

    @abstractmethod
    def run(
        self, data: FloatArray, spec: ReleaseSpec[P], rng: np.random.Generator
    ) -> MechanismOutput:
        """Run on ``data`` (``n x d``, possibly a read-only memory map) with randomness ``rng``."""

    @abstractmethod
    def preview(self, ctx: PublicContext, spec: ReleaseSpec[P]) -> Preview:
        """The noise scales and thresholds :meth:`run` would use with ``spec`` (the params
        returned by :meth:`prepare`), and what they mean. Public facts only: never the data."""

    def for_accounting(self, accounting: str, params: P) -> P:
        """``params`` adapted to the dataset's accounting before :meth:`prepare` (public: the
        accounting is a fact of the dataset): a mechanism with a variant only ``basic`` can
        charge picks, by default, one the filter can. Identity unless overridden; never
        overrides a value the request gave."""
        return params

    def privacy_steps(self, ctx: PublicContext, spec: ReleaseSpec[P]) -> list[PrivacyStep] | None:
        """The steps whose adaptive composition is this release's privacy argument, from the
        prepared spec (public facts only), or ``None`` when no per-step profile is proven (then
        only ``basic`` accounting admits the mechanism). The steps must be exactly the ones
        :meth:`run` performs with ``spec``: the ledger charges their sum."""
        return None

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[P]) -> int:
        """Peak working memory of :meth:`run` in bytes, beyond the (memory-mapped) data.

        A function of public facts only (``n``, ``d``, ``k``, resolved params), derived from the
        mechanism's own code: the API refuses a release whose estimate exceeds
        ``DPSS_WORKER_MEMORY_MB`` before charging, so a worker never runs out of memory in a way
        that depends on the data. ``spec.params`` are the params returned by :meth:`prepare`.
        """
        raise NotImplementedError(f"{self.name} has no memory estimate")


def resolve_clip_norm(clip_norm: float | None, ctx: PublicContext) -> float:
    """The public clip norm: the request's, else the dataset's declared bound, else refuse."""
    if clip_norm is not None:
        return clip_norm
    if ctx.row_norm_bound is not None:
        return ctx.row_norm_bound
    raise InvalidParameter(
        "clip_norm",
        "required: this dataset has no row_norm_bound; send a public bound C on the rows' "
        # Only the JSON example: each client surface writes it in its own spelling
        # (dpss_client.spelling), and a parenthetical naming the CLI's and PrivatePCA's was
        # then printed as "--param clip_norm=C (the CLI: --param clip_norm=C; ...)".
        'norms, "params": {"clip_norm": C}, chosen from domain knowledge, never computed from '
        "the data (rows above it are scaled down to it), or ask the dataset's owner to upload "
        "it with a row_norm_bound",
    )


#: Every magnitude a clipping mechanism computes (a multiple of ``C^2``: Gram entries up to
#: ``n C^2``, eigenvalues, noise scales, grids) must lie in ``[2^MIN, 2^MAX]``. The lower end is
#: 53 bits above the smallest normal double, so noise and grids keep full precision; the upper
#: end leaves a factor 2^63 below the largest double for sums and norms inside LAPACK.
MIN_MAGNITUDE_LOG2 = -969
MAX_MAGNITUDE_LOG2 = 960


def clip_norm_range(low_multiple: float, high_multiple: float) -> tuple[float, float]:
    """The clip norms ``C`` for which ``C^2 low`` and ``C^2 high`` stay in the safe range."""
    c_min = 2.0 ** ((MIN_MAGNITUDE_LOG2 - math.log2(low_multiple)) / 2.0)
    c_max = 2.0 ** ((MAX_MAGNITUDE_LOG2 - math.log2(high_multiple)) / 2.0)
    return c_min, c_max


def check_clip_scale(clip_norm: float, low_multiple: float, high_multiple: float) -> None:
    """Refuse a clip norm whose square, times what the calibration computes, over- or underflows.

    Decided from public facts in log space (``C^2`` itself may not be representable), before
    anything is charged: a release doomed by floating point must not be accepted and then fail.
    """
    c2_log2 = 2.0 * math.log2(clip_norm)
    too_big = c2_log2 + math.log2(high_multiple) > MAX_MAGNITUDE_LOG2
    too_small = c2_log2 + math.log2(low_multiple) < MIN_MAGNITUDE_LOG2
    if too_big or too_small:
        c_min, c_max = clip_norm_range(low_multiple, high_multiple)
        raise InvalidParameter(
            "clip_norm",
            f"{clip_norm:.6g} is too {'large' if too_big else 'small'} for floating point: "
            f"C^2 times the largest quantity this release computes ({high_multiple:.3g}) and "
            f"times the smallest ({low_multiple:.3g}) must stay within [2^{MIN_MAGNITUDE_LOG2}, "
            f"2^{MAX_MAGNITUDE_LOG2}]; here that needs {c_min:.6g} <= clip_norm <= "
            f"{c_max:.6g} (rescale the data and the bound together)",
        )


class ClippingMechanism(Mechanism[CP]):
    """A mechanism that clips rows to a public norm ``C``: ``prepare`` resolves ``clip_norm``
    (the request's, else the dataset's declared bound, else a refusal) and refuses a ``C`` whose
    square, times any quantity the calibration computes, is not a comfortably finite double."""

    def check_specific(self, ctx: PublicContext, k: int, params: CP) -> None:
        """Further public-fact checks of a subclass; raise :class:`InvalidParameter`."""

    def c2_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float
    ) -> tuple[float, float]:
        """``(smallest, largest)`` multiple of ``C^2`` that :meth:`Mechanism.run` computes.

        Default: ``C^2`` itself and the Gram matrix's entries, at most ``n C^2``. Subclasses add
        their eigenvalues, noise scales and grids. Both are positive functions of public facts.
        """
        return 1.0, float(max(1, ctx.n_rows))

    def prepare(self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: CP) -> CP:
        self.check_common(ctx, k, epsilon, delta)
        self.check_specific(ctx, k, params)
        clip_norm = resolve_clip_norm(params.clip_norm, ctx)
        check_clip_scale(clip_norm, *self.c2_multiples(ctx, k, epsilon, delta))
        return params.model_copy(update={"clip_norm": clip_norm})
