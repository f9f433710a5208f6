"""Release requests and their results."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

from pydantic import Field

from api_schemas.common import (
    ExactDecimal,
    Name,
    RequestSchema,
    Schema,
    StrictDecimal,
    StrictInt,
    number_schema,
)

ReleaseStatus = Literal["queued", "running", "succeeded", "no_result", "failed"]


class ReleaseRequest(RequestSchema):
    """Ask for a private rank-k release of a dataset."""

    # `"center": "private"` at the top level is the usual slip (the README's tables name it).
    unknown_field_hint: ClassVar[str] = (
        ' (mechanism parameters such as center go inside params: "params": {"center": "private"})'
    )

    mechanism: Name = Field(
        default="auto",
        description=(
            "Mechanism name; see `GET /v1/mechanisms`. Absent: `auto`, the default (as in "
            "`Client.release`, `dpss releases create` and `PrivatePCA`): the service chooses "
            "and says what and why; it takes only its own params, so a parameter of a named "
            "mechanism (e.g. `clip_quantile`) needs that mechanism named."
        ),
    )
    k: StrictInt = Field(
        ge=1,
        le=100_000,
        description=(
            "Dimension of the released subspace (for `spectrum`: how many singular values)."
        ),
    )
    epsilon: Annotated[StrictDecimal, Field(gt=0, le=1000), number_schema(gt=0, le=1000)] | None = (
        Field(
            default=None,
            description=(
                "Privacy cost epsilon: a JSON number or a decimal string in ASCII digits, at "
                "most 30 decimal places. On a `basic` dataset the charge; on `gaussian`, `zcdp` "
                "and `hybrid` datasets the single-release target the mechanism is calibrated "
                "to, charged its own cost in the dataset's currency (each filter's, on "
                "`hybrid`). Required unless `mu` or `rho` is given."
            ),
        )
    )
    delta: Annotated[StrictDecimal, Field(ge=0, lt=1), number_schema(ge=0, lt=1)] | None = Field(
        default=None,
        description=(
            "Privacy cost delta, with `epsilon` (0 only for pure-DP mechanisms). Absent with "
            "`epsilon`: min(1e-6, the dataset's delta_total / 100), and under a grant also at "
            "most the grant's delta / 100 (on a `zcdp` dataset its delta for approximate steps, "
            "if it has one; a `gaussian` grant holds none), so that the default fits the budget "
            "the release is charged to; the dry run shows it and the release records it (0 on "
            "a dataset, or `basic` grant, without a delta budget, and on a `hybrid` dataset for "
            "a release whose steps are all pure, e.g. `smooth_sensitivity`'s Cauchy variant: "
            "it spends none). With `rho` (`zcdp` and "
            "`hybrid` datasets), the approximate-zCDP delta of mechanisms with approximate "
            "steps (0 or absent for purely Gaussian ones). At most 30 decimal places."
        ),
    )
    mu: Annotated[StrictDecimal, Field(gt=0, le=1000), number_schema(gt=0, le=1000)] | None = Field(
        default=None,
        description=(
            "`gaussian` and `hybrid` datasets: the release's Gaussian-DP cost mu (the "
            "mechanism's steps use noise sigma_j with sum (Delta_j/sigma_j)^2 <= mu^2; on "
            "`hybrid`, the currency of filter A' (GDP): pure steps count at their GDP mu, a "
            "mechanism with approximate steps is refused, and every filter is charged the "
            "release so calibrated). Instead of epsilon."
        ),
    )
    rho: Annotated[StrictDecimal, Field(gt=0, le=1000), number_schema(gt=0, le=1000)] | None = (
        Field(
            default=None,
            description=(
                "`zcdp` and `hybrid` datasets: the release's zCDP cost rho (on `hybrid`, the "
                "currency of filter B (zCDP); every filter is charged the release so "
                "calibrated), with `delta` for mechanisms with approximate steps. Instead of "
                "epsilon."
            ),
        )
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Mechanism parameters; see the mechanism's `params_schema`.",
    )


class ReleaseResult(Schema):
    """What a finished release produced."""

    basis: list[list[float]] | None = Field(
        default=None,
        description="Orthonormal basis, `d` lists of `k` floats; absent for `spectrum`, and "
        "null when asked for as `basis_format=base64` (then `basis_base64`).",
    )
    basis_base64: str | None = Field(
        default=None,
        description="With `basis_format=base64` only: the basis exactly as stored, base64 of "
        "its bytes (little-endian float64, row-major, `basis_shape`); their SHA-256 is "
        "`basis_sha256`. The same numbers as `basis`, without printing and parsing decimal "
        "text (a tenth of the bytes' cost for a client that wants an array).",
    )
    basis_shape: list[int] | None = Field(
        default=None,
        description="With `basis_format=base64` only: `[d, k]` of `basis_base64`.",
    )
    basis_sha256: str | None = Field(
        default=None,
        description=(
            "SHA-256 of the basis as stored (little-endian float64, row-major); "
            "also in the audit log."
        ),
    )
    extras: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Further private outputs of the mechanism (e.g. noisy eigenvalues). analyze_gauss "
            "adds `explained_variance_ratio` (per component; its sum the point estimate of the "
            "share of the rows' sum of squares kept, the rows clipped at the clip norm: centred "
            "with a centre, uncentred with `center` `none`, the default), "
            "`explained_variance_ratio_interval` (90% for that sum) and "
            "`explained_variance_hidden_by_noise` (true when the interval is at least 0.3 "
            "wide, or would be if not cut at 0 or 1: the noise hides the share, so no point "
            "is stated: `explained_variance_ratio` and `explained_sum_of_squares` are null, "
            "and so are `captured_sum_of_squares`, `residual_sum_of_squares` and "
            "`total_sum_of_squares`, whose ratios would read as that point; the interval and "
            "`variance_noise_std` stay, and `warning` says so; before 30 Nov 2026 they carried "
            "figures beside the flag), and "
            "`explained_variance_split_hidden_by_noise` (true when the components span the "
            "whole space, k = d, so the share is exactly 1 with the interval [1, 1], but "
            "fewer of them stand out of the noise than were released, "
            "`components_above_noise` < k: how the total splits among them is not measured, "
            "so `explained_variance_ratio` and `explained_sum_of_squares` are null and "
            "`warning` says so; false otherwise; absent before 1 Dec 2026). Where the share "
            "is not hidden, "
            "`captured_sum_of_squares` and `residual_sum_of_squares` are the noisy sums "
            "(noise sd `variance_noise_std`) cut at 0: a draw below 0 is shown as 0, a sum "
            "within about twice the noise sd of 0; docs/mechanisms.md lists every "
            "mechanism's extras."
        ),
    )


class EpochSummary(Schema):
    """One epoch of a continual release, without its basis."""

    epoch: int = Field(description="Epoch number t (1-based): released after batch t - 1.")
    batch_seq: int = Field(description="The batch whose arrival this epoch follows (0: upload).")
    n_rows_read: int = Field(description="Rows of that batch (public).")
    basis_sha256: str | None = Field(
        default=None,
        description="SHA-256 of the epoch's basis as stored; also in its `release_epoch` event.",
    )


class Epoch(EpochSummary):
    """One epoch of a continual release: the top-k subspace of the noisy prefix sum after its
    batch. Every epoch is post-processing of the one charged release."""

    basis: list[list[float]] | None = Field(
        default=None, description="Orthonormal basis, `d` lists of `k` floats."
    )
    extras: dict[str, Any] = Field(
        default_factory=dict,
        description="Further outputs: `epoch`, `noise_sigma`, `prefix_entry_std`, noisy "
        "`eigenvalues`, ...",
    )
    created_at: datetime | None = Field(
        default=None,
        description="When the epoch was stored. Always null (see `Release.started_at`).",
    )


class EpochList(Schema):
    """A page of a continual release's epochs, oldest first."""

    items: list[Epoch] = Field(description="The epochs on this page.")
    total: int = Field(description="How many epochs the release has released so far.")
    next: str | None = Field(
        description="Opaque cursor of the next page (pass it as `cursor`); null on the last page."
    )


class Release(Schema):
    """A release job and, once finished, its result."""

    id: UUID = Field(description="Release id.")
    dataset_id: UUID = Field(description="The dataset released from.")
    mechanism: str = Field(description="Mechanism name.")
    k: int = Field(description="Requested dimension.")
    epsilon: ExactDecimal = Field(
        description=(
            "Epsilon charged (basic datasets); on gaussian, zcdp and hybrid datasets the "
            "single-release epsilon the mechanism was calibrated to (hybrid: what its basic "
            "filter, C, counts against its epsilon)."
        )
    )
    delta: ExactDecimal = Field(
        description=(
            "Delta charged (basic); on gaussian, zcdp and hybrid datasets the single-release "
            "delta the mechanism was calibrated to. Under hybrid its basic filter (C) counts "
            "it against its delta share (so delta_spent moves by it), while its Gaussian-DP "
            "filter holds its own share for the conversion: a Gaussian release has a delta "
            "here and cost_delta 0, both true."
        )
    )
    rho: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian, zcdp and hybrid datasets: the rho charged (gaussian: mu^2/2; hybrid: "
            "to its zCDP filter, B), rounded up; null on basic datasets."
        ),
    )
    cost_delta: ExactDecimal | None = Field(
        default=None,
        description=(
            "zcdp datasets: the approximate-zCDP delta charged (its approximate steps' delta, "
            "from delta_total less delta_conversion); hybrid: the same, charged to its zCDP "
            "filter's share for approximate steps, so 0 for a release with only Gaussian and "
            "pure steps (its single-release `delta` is a different figure, counted by the "
            "basic filter), null for a release without a privacy profile; null on basic "
            "datasets."
        ),
    )
    params: dict[str, Any] = Field(
        description="Parameters as resolved before running (defaults filled in from public facts)."
    )
    status: ReleaseStatus = Field(
        description=(
            "`queued`, `running`, `succeeded`, `no_result` (the mechanism declined; "
            "charged) or `failed`. Analysts see `queued` until `visible_at`. A continual "
            "release is `running` while it follows its dataset (one epoch per batch) and "
            "`succeeded` after its horizon's last epoch."
        )
    )
    reason: str | None = Field(
        default=None, description="Why the release ended in `no_result` or `failed`."
    )
    refunded: bool = Field(
        default=False,
        description=(
            "True when the charge was refunded because the job provably never read the data."
        ),
    )
    result: ReleaseResult | None = Field(
        default=None,
        description="Present when `status` is `succeeded` (and extras for `no_result`).",
    )
    n_rows_read: int | None = Field(
        default=None,
        description=(
            "One-shot releases: the rows they read, those present when they were requested "
            "(batches appended later are not read). Null for continual releases (see `epochs`)."
        ),
    )
    batches_read: int | None = Field(
        default=None,
        description=(
            "One-shot releases: how many batches they read (batches 0 .. batches_read - 1)."
        ),
    )
    epochs_done: int | None = Field(
        default=None,
        description=(
            "Continual releases: how many epochs were released so far (at most the horizon); "
            "null for one-shot releases."
        ),
    )
    latest_epoch: Epoch | None = Field(
        default=None,
        description="Continual releases: the newest epoch, with its basis (null before the first).",
    )
    epochs: list[EpochSummary] | None = Field(
        default=None,
        description=(
            "Continual releases: every epoch so far, oldest first, without bases (page through "
            "`GET /v1/releases/{id}/epochs` for them)."
        ),
    )
    created_at: datetime = Field(description="Request time (UTC).")
    visible_at: datetime | None = Field(
        default=None,
        description=(
            "Earliest time (UTC) an analyst or owner sees the outcome: `created_at` plus a "
            "padding computed from public facts (mechanism, n, d, k, params). Until then they see "
            "`status: queued` and no result, whatever the job's real state, so polling does "
            "not reveal how long it ran. Poll after this time."
        ),
    )
    started_at: datetime | None = Field(
        default=None,
        description=(
            "When a worker last claimed the job. Always null: run time can depend on the data, "
            "and a claim's moment tells when the job ahead of it in the queue (on any dataset) "
            "ended, so neither analysts nor owners see it."
        ),
    )
    finished_at: datetime | None = Field(
        default=None,
        description="When the job ended. Always null (see `started_at`).",
    )
    attempts: int | None = Field(
        default=None,
        description=(
            "How many times a worker has claimed the job (a retry can follow a crash). Always "
            "null (see `started_at`)."
        ),
    )


#: What a refusal (409) and an unaffordable dry run offer instead, described once for both.
#: What a budget figure protects (the same words as ``Budget.privacy_unit``): stated wherever
#: the budget is (DESIGN.md, "Privacy unit").
PRIVACY_UNIT = (
    "What the budget figures here protect: `row` (neighbouring datasets replace one row) or "
    "`person` (the dataset has a privacy_unit_column: they replace all rows of one person, and "
    "every release's cost is per person)."
)

EPSILON_ADMISSIBLE = (
    "the largest epsilon (3 significant digits, rounded down, checked) at which this same "
    "request (mechanism, k, params and delta) is admitted now by the budget named by `budget` "
    "and the dataset's; null when none is, or the request was given in mu or rho. On hybrid "
    "`epsilon_remaining` is what a Gaussian release asked at the budget's delta is admitted "
    "at, not what every kind of release (or another delta) may ask for: a pure or approximate "
    "release is charged by filters that count it differently."
)
DELTA_ADMISSIBLE = (
    "Null unless epsilon_admissible is null for a request given in epsilon: then a delta (0 if "
    "the mechanism allows pure DP, else the largest power of ten at most 6 decades below the "
    "request's delta) at which this same request (mechanism, k and params; only the delta "
    "changed) is admitted now, e.g. on hybrid after releases that spent its delta filter; null "
    "when none is."
)
DELTA_ADMISSIBLE_EPSILON = (
    "With delta_admissible: the largest epsilon (3 significant digits, rounded down, checked) "
    "at which the same request at delta_admissible is admitted now."
)


class BudgetExceeded(Schema):
    """Body of a 409 `budget_exceeded`."""

    error: Literal["budget_exceeded"] = Field(description="Always `budget_exceeded`.")
    detail: str = Field(description="Explanation.")
    privacy_unit: Literal["row", "person"] = Field(default="row", description=PRIVACY_UNIT)
    epsilon_remaining: ExactDecimal = Field(
        description=(
            "Epsilon still available in the budget named by `budget`, stated as GET .../budget "
            "(or the grant) states it: on gaussian, zcdp and hybrid, epsilon at the dataset's "
            "delta_total (rounded down): what a Gaussian release asked at that delta "
            "(stated_at_delta) is admitted at. epsilon_admissible is at the request's own delta, "
            "so the two may differ; the message says at which delta each holds."
        )
    )
    epsilon_remaining_pure: ExactDecimal | None = Field(
        default=None,
        description=(
            "What a pure release (delta = 0) is admitted at in that budget now, as GET "
            ".../budget (or the grant) states it; absent for gaussian (Gaussian releases only)."
        ),
    )
    stated_at_delta: ExactDecimal | None = Field(
        default=None,
        description=(
            "The delta epsilon_remaining is stated at: the budget's (a grant's own delta). "
            "basic: its epsilon_remaining holds at any delta within delta_remaining."
        ),
    )
    delta_remaining: ExactDecimal = Field(
        description=(
            "Delta still available in the budget named by `budget`, as GET .../budget states it "
            "(hybrid: its zCDP filter's share for approximate steps plus its basic filter's "
            "share, what each may still spend)."
        )
    )
    epsilon_admissible: ExactDecimal | None = Field(
        default=None,
        description=(EPSILON_ADMISSIBLE[0].upper() + EPSILON_ADMISSIBLE[1:]),
    )
    delta_admissible: ExactDecimal | None = Field(default=None, description=DELTA_ADMISSIBLE)
    delta_admissible_epsilon: ExactDecimal | None = Field(
        default=None, description=DELTA_ADMISSIBLE_EPSILON
    )
    budget: Literal["dataset", "grant"] = Field(
        default="dataset",
        description=(
            "Which budget would go negative: the analyst's `grant` (checked first) or the "
            "`dataset`'s. Nothing was charged to either."
        ),
    )
    grant_id: UUID | None = Field(
        default=None, description="The grant that is short, when `budget` is `grant`."
    )
    rho_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian, zcdp and hybrid datasets: rho still available in that budget (gaussian: "
            "mu_remaining^2/2; hybrid: its zCDP filter's, 0 once that filter no longer holds). "
            "Absent for basic."
        ),
    )
    mu_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian and hybrid: the largest mu one more release may use in that budget "
            "(rounded down; hybrid: its Gaussian-DP filter's, 0 once that filter no longer "
            "holds), as GET .../budget states it."
        ),
    )
    delta_reserved_for_conversion: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian and zcdp: the dataset's delta held back to convert rho to (epsilon, "
            "delta), which no mechanism spends (not in delta_remaining); hybrid: its Gaussian-DP "
            "filter's share plus its zCDP filter's conversion share, as GET .../budget states it."
        ),
    )


class PreviewWarning(Schema):
    """A warning of a dry run: the requested mechanism is dominated here (public facts only)."""

    code: Literal["dominated_mechanism"] = Field(
        description=(
            "`dominated_mechanism`: the measured rule table (docs/mechanisms.md, 'Choosing a "
            "mechanism') has another mechanism, which runs on this request, more accurate at "
            "the same (epsilon, delta) wherever both run."
        )
    )
    message: str = Field(description="What was measured and what to do, in plain words.")
    better_mechanism: str = Field(
        description="The mechanism to request instead (takes the same params)."
    )
    docs: str = Field(description="The documentation section with the derivation and figures.")


class ReleasePreview(Schema):
    """What a release would cost and use (`?dry_run=true`); nothing was charged or created.

    Every number comes from public facts (n, d, k, the params, epsilon, delta, the declared row
    norm bound) through the same functions the mechanism's run uses; never from the data.
    """

    dry_run: Literal[True] = Field(description="Always true: this is a preview, not a release.")
    dataset_id: UUID = Field(description="The dataset the release would read.")
    privacy_unit: Literal["row", "person"] = Field(default="row", description=PRIVACY_UNIT)
    mechanism: str = Field(description="Mechanism name.")
    k: int = Field(description="Requested dimension.")
    epsilon: ExactDecimal = Field(
        description=(
            "Epsilon of the single release the mechanism is calibrated to: what the same "
            "request costs on a `basic` dataset (there, the charge)."
        )
    )
    delta: ExactDecimal = Field(description="Delta of that single release (basic: the charge).")
    params: dict[str, Any] = Field(
        description="Parameters as a real request would resolve them (defaults filled in)."
    )
    accounting: Literal["basic", "gaussian", "zcdp", "hybrid"] = Field(
        description="The dataset's accounting, which says what is charged."
    )
    mu: ExactDecimal | None = Field(
        default=None,
        description=(
            "The release's Gaussian-DP cost (rounded up), when every step is Gaussian: what a "
            "`gaussian` dataset charges (as mu^2/2); on a `hybrid` dataset also with pure steps "
            "(each at mu = -2 Phi^-1(1/(1+e^eps))): what its Gaussian-DP filter charges (mu^2)."
        ),
    )
    rho: ExactDecimal | None = Field(
        default=None,
        description=(
            "The release's zCDP cost rho from its declared steps (rounded up): what a `zcdp` "
            "dataset charges (gaussian: mu^2/2). Null when the mechanism has no proven profile."
        ),
    )
    zcdp_delta: ExactDecimal | None = Field(
        default=None,
        description="The approximate-zCDP delta of its approximate steps (0 if purely Gaussian).",
    )
    rho_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian, zcdp and hybrid: rho left in the budget named by `budget` (hybrid: its "
            "zCDP filter's, 0 once that filter no longer holds)."
        ),
    )
    mu_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian and hybrid: the largest mu one more release may use in that budget "
            "(rounded down; hybrid: its Gaussian-DP filter's, 0 once that filter no longer "
            "holds), as GET .../budget states it."
        ),
    )
    delta_reserved_for_conversion: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian and zcdp: the dataset's delta held back to convert rho to (epsilon, "
            "delta), which no mechanism spends (not in delta_remaining); hybrid: its Gaussian-DP "
            "filter's share plus its zCDP filter's conversion share, as GET .../budget states it."
        ),
    )
    releases_remaining: int | None = Field(
        default=None,
        description=(
            "How many more releases exactly like this one the remaining budget buys (this one "
            "included); null when it costs nothing."
        ),
    )
    affordable: bool = Field(
        description=(
            "Whether the remaining budget covers the cost now. A real request that it does not "
            "cover is refused with 409 `budget_exceeded`; a preview says so here instead."
        )
    )
    epsilon_admissible: ExactDecimal | None = Field(
        default=None,
        description=("Null when affordable; otherwise " + EPSILON_ADMISSIBLE),
    )
    delta_admissible: ExactDecimal | None = Field(default=None, description=DELTA_ADMISSIBLE)
    delta_admissible_epsilon: ExactDecimal | None = Field(
        default=None, description=DELTA_ADMISSIBLE_EPSILON
    )
    epsilon_remaining: ExactDecimal = Field(
        description=(
            "Epsilon left in the budget named by `budget`, as GET .../budget (or the grant) "
            "states it (gaussian, zcdp: at the dataset's delta_total)."
        )
    )
    epsilon_remaining_pure: ExactDecimal | None = Field(
        default=None,
        description=(
            "What a pure release (delta = 0) is admitted at now in the budget named by "
            "`budget`, as GET .../budget (or the grant) states it; null for gaussian "
            "(Gaussian releases only). On hybrid and zcdp not epsilon_remaining, a Gaussian "
            "release's figure at the budget's delta."
        ),
    )
    delta_remaining: ExactDecimal = Field(
        description=(
            "Delta left in the budget named by `budget`, as GET .../budget states it (hybrid: "
            "its zCDP filter's share for approximate steps plus its basic filter's share, what "
            "each may still spend)."
        )
    )
    budget: Literal["dataset", "grant"] = Field(
        default="dataset",
        description=(
            "Which budget the remaining figures are of: the analyst's `grant` when the release "
            "would be charged to one (unless only the dataset is short), else the `dataset`'s. A "
            "real release is charged to both."
        ),
    )
    grant_id: UUID | None = Field(
        default=None, description="The grant a real release would be charged to, if any."
    )
    memory_mb: float = Field(
        description="The run's working-memory estimate in MiB (a real request above the "
        "worker limit is refused with 422)."
    )
    scales: dict[str, float | int | str | bool | None] = Field(
        description=(
            "The noise scales, thresholds and counts the mechanism would use, by name (see "
            "docs/mechanisms.md, 'Preview before spending', for each mechanism's names)."
        )
    )
    meaning: list[str] = Field(
        description="What those numbers imply for the result, in plain sentences."
    )
    admitted_by: list[Literal["gdp", "zcdp", "basic"]] | None = Field(
        default=None,
        description=(
            "hybrid: which of the dataset's filters would admit the whole sequence with this "
            "release (`gdp`: the Gaussian-DP filter, Gaussian and pure steps; `zcdp`: "
            "approximate zCDP; `basic`: sums of (epsilon, delta)); empty when none would (the "
            "request would be refused with 409). Null on the other accountings."
        ),
    )
    recommended_accounting: Literal["basic", "gaussian", "zcdp", "hybrid"] | None = Field(
        default=None,
        description=(
            "The accounting that fits releases like this one on a dataset of this budget "
            "(issue 31, item 5): hybrid (the default) in general, and for a purely Gaussian "
            "request too (auto included when every step it declares is Gaussian, as for PCA "
            "by auto with analyze_gauss; one request is no plan: gaussian, 0.8% less noise, "
            "refuses every "
            "other mechanism, so it is recommended only at upload, for planned_mechanisms that "
            "are all purely Gaussian); for pure or approximate steps basic for at most two "
            "releases of this epsilon, zcdp for more. Advice for the owner's next upload: a "
            "dataset's accounting is fixed."
        ),
    )
    recommendation_reason: str | None = Field(
        default=None, description="Why recommended_accounting fits, with the measured figures."
    )
    warnings: list[PreviewWarning] = Field(
        default_factory=list,
        description=(
            "Public-facts warnings: empty unless the requested mechanism is dominated here "
            "(smooth_sensitivity with delta > 0, gap_perturbation), each naming the better "
            "mechanism and the docs section. A warning refuses nothing: the release may still "
            "be requested."
        ),
    )
