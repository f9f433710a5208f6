"""Datasets and their budgets."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BeforeValidator, Field

from api_schemas.common import (
    ColumnName,
    ExactDecimal,
    Name,
    RequestSchema,
    SafeStr,
    Schema,
    StrictBool,
    StrictDecimal,
    StrictFloat,
    number_schema,
)

Accounting = Literal["basic", "gaussian", "zcdp", "hybrid"]


def _form_bool(value: object) -> object:
    """A multipart form sends text: exactly "true" or "false" (any case) is a boolean there;
    anything else goes on to strict validation, which accepts only a JSON boolean."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


#: A boolean as a JSON value or as the form text "true"/"false" (never "1", "yes", "on").
FormBool = Annotated[StrictBool, BeforeValidator(_form_bool)]


class Budget(Schema):
    """A dataset's privacy budget. Values are exact decimals serialised as strings.

    ``basic`` accounting sums ``(epsilon, delta)``. ``gaussian`` sums ``mu^2`` against
    ``mu_total^2`` (a Gaussian-DP filter); ``zcdp`` sums ``rho`` and ``delta`` against
    ``rho_total`` and ``delta_total - delta_conversion`` (an approximate-zCDP filter).
    ``hybrid`` (the default) admits a release when its GDP filter (``mu``), its zCDP filter
    (``rho``) or its basic filter would. On those three, ``epsilon_spent`` is the epsilon that
    what was spent amounts to at ``delta_total``.
    """

    privacy_unit: Literal["row", "person"] = Field(
        default="row",
        description=(
            "What these figures protect: `row` (neighbouring datasets replace one row) or "
            "`person` (the dataset has a privacy_unit_column: they replace all rows of one "
            "person, and every release's cost is per person)."
        ),
    )
    # Required, with no default: a response's default would read, in the manual, as the
    # service's default accounting (it is `hybrid` for budgets with delta > 0, `basic` for pure).
    accounting: Accounting = Field(
        description=(
            "How releases compose: `hybrid` (the default for a budget with delta > 0), `basic` "
            "(always for delta = 0), `gaussian` or `zcdp`."
        ),
    )
    epsilon_total: ExactDecimal = Field(description="Total epsilon the owner granted.")
    delta_total: ExactDecimal = Field(description="Total delta the owner granted.")
    epsilon_spent: ExactDecimal = Field(
        description=(
            "basic: epsilon charged by releases (net of refunds). gaussian, zcdp: the smallest "
            "epsilon at which everything spent so far is (epsilon, delta_total)-DP (rounded up); "
            "hybrid: the smallest such epsilon of its filters that still hold."
        )
    )
    delta_spent: ExactDecimal = Field(
        description=(
            "Delta charged by releases (net of refunds); 0 under gaussian accounting. hybrid: "
            "the part of its zCDP filter's share for approximate steps and of its basic filter's "
            "share no longer available (spent, or closed with its filter; each filter counts "
            "every release, so one release may move both); delta_reserved_for_conversion + "
            "delta_spent + delta_remaining = delta_total."
        )
    )
    epsilon_remaining: ExactDecimal = Field(
        description=(
            "What the ledger admits next. basic: epsilon_total - epsilon_spent (rounded "
            "down). gaussian, zcdp, hybrid: the largest epsilon at which a Gaussian release (the "
            "default kind) asked at (epsilon, delta_total) is admitted now, which after a "
            "release is more than epsilon_total - epsilon_spent (the Gaussian-DP filter adds up "
            "mu^2, the zCDP filter rho, not epsilon); under zcdp it is below epsilon_total even "
            "unspent (0.897 of a (1, 1e-6) budget: its rho_total is epsilon_total converted by "
            "a bound looser than the Gaussian's own curve, at half its delta). A pure release "
            "is admitted at epsilon_remaining_pure; for an approximate one a dry run gives "
            "epsilon_admissible."
        )
    )
    epsilon_remaining_pure: ExactDecimal | None = Field(
        default=None,
        description=(
            "What a pure release (delta = 0: smooth_sensitivity's Cauchy variant, auto at "
            "delta 0) is admitted at now: the largest epsilon of such a release, its pure "
            "steps' epsilons adding up to it. basic: epsilon_remaining. zcdp: sqrt(2 "
            "rho_remaining) (a pure epsilon step is charged epsilon^2/2). hybrid: the largest of "
            "its filters' figures. Not epsilon_remaining, a Gaussian release's figure at "
            "delta_total: under hybrid it is more while the basic filter holds (a pure release "
            "is admitted up to the owner's epsilon: 1 of a fresh (1, 1e-5) budget whose "
            "epsilon_total, the Gaussian figure, is 0.9973), less once that filter is closed (a "
            "pure step costs the Gaussian-DP filter more than a Gaussian one of the same "
            "epsilon). Null for gaussian (it admits Gaussian releases only)."
        ),
    )
    delta_remaining: ExactDecimal = Field(
        description=(
            "Delta releases may still spend: delta_total - delta_spent (basic); delta_total - "
            "delta_conversion - delta_spent (zcdp); 0 (gaussian); hybrid: what approximate steps "
            "may still spend under its zCDP filter (of its share for approximate steps, 2% by "
            "default) plus what single releases may still spend under its basic filter (of its "
            "share, 1% by default), each 0 once its filter no longer holds. A Gaussian release "
            "under hybrid needs none of it (its Gaussian-DP filter holds its own share for the "
            "conversion): 0 here does not mean nothing is admitted (see epsilon_remaining)."
        )
    )
    rho_total: ExactDecimal | None = Field(
        default=None,
        description=(
            "zcdp: the largest rho whose conversion (Canonne, Kamath & Steinke 2020) is within "
            "(epsilon_total, delta_conversion), rounded down. gaussian: mu_total^2/2. hybrid: its "
            "zCDP filter's, at its conversion share of delta. Null for basic."
        ),
    )
    rho_spent: ExactDecimal | None = Field(
        default=None,
        description="Rho charged by releases (net of refunds); null for basic.",
    )
    rho_remaining: ExactDecimal | None = Field(
        default=None,
        description="rho_total - rho_spent (hybrid: 0 once its zCDP filter no longer holds); null "
        "for basic.",
    )
    mu_total: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian: the largest mu whose Gaussian-DP curve is within (epsilon_total, "
            "delta_total), rounded down; hybrid: its Gaussian-DP filter's, within its share of "
            "delta. Null otherwise."
        ),
    )
    mu_spent: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian, hybrid: sqrt(sum of the releases' mu^2), rounded up (hybrid: Gaussian "
            "steps' (Delta/sigma)^2 and pure epsilon steps' mu = -2 Phi^-1(1/(1+e^epsilon)))."
        ),
    )
    mu_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian, hybrid: sqrt(mu_total^2 - mu_spent^2), rounded down: the largest mu one "
            "more release may use (hybrid: 0 once its Gaussian-DP filter no longer holds)."
        ),
    )
    delta_conversion: ExactDecimal | None = Field(
        default=None,
        description="zcdp: the share of delta_total reserved for converting rho_total.",
    )
    delta_reserved_for_conversion: ExactDecimal | None = Field(
        default=None,
        description=(
            "The part of delta_total held back to convert rho to (epsilon, delta): never spent "
            "by a mechanism, so not in delta_remaining. zcdp: delta_conversion; gaussian: all "
            "of delta_total; hybrid: its Gaussian-DP filter's share (96% by default) plus its "
            "zCDP filter's conversion share (1%); null for basic. See docs/mechanisms.md, "
            "'Reading a budget'."
        ),
    )


class Dataset(Schema):
    """Dataset metadata. Never includes data values."""

    id: UUID = Field(description="Dataset id.")
    name: str = Field(description="The owner's name for the dataset.")
    n_rows: int = Field(description="Number of rows (individuals) in all batches so far; public.")
    n_batches: int = Field(
        description=(
            "Number of batches: the upload (or the registered reference) is batch 0, each "
            "`POST /v1/datasets/{id}/rows` (or, by reference, each registered "
            "`POST /v1/dataset-references/{id}/batches`) adds one; public."
        )
    )
    n_cols: int = Field(description="Number of columns (dimension d); public.")
    row_norm_bound: float | None = Field(
        description=(
            "Public bound C on row norms declared by the owner, used as default clip norm; "
            "null: none declared, so each release sends `params.clip_norm`."
        )
    )
    budget: Budget = Field(description="Current budget.")
    created_at: datetime = Field(description="Upload time (UTC).")
    reference: str | None = Field(
        default=None,
        description=(
            "For a dataset registered by reference (`POST /v1/dataset-references`), shown to "
            "its owner only: the URI of its Parquet objects, which the service reads but does "
            "not own. Null for an uploaded dataset and for every other caller: the URI is the "
            "location of the raw rows (see `by_reference` and `reference_sha256`)."
        ),
    )
    by_reference: bool = Field(
        default=False,
        description=(
            "Whether the dataset is registered by reference (its rows stay in the owner's "
            "storage); public."
        ),
    )
    reference_sha256: str | None = Field(
        default=None,
        description=(
            "For a registered dataset by reference: the SHA-256 of its registered record "
            "(every object's identity and content digests, canonical JSON), the "
            "`reference_sha256` its latest `dataset_referenced` or `dataset_batch_referenced` "
            "audit event carries; it changes when a batch is added. Names no location. Null "
            "for an upload and while the registration is pending or failed."
        ),
    )
    registration_status: Literal["registering", "ready", "failed"] = Field(
        default="ready",
        description=(
            "`registering`: a dataset by reference whose objects a worker is still reading "
            "and checking (n_rows is 0 and n_cols the columns named until then; releases, "
            "grants and appends are refused with 409 `dataset_not_ready`); `ready`: usable; "
            "`failed`: the objects were refused (see `registration_reason`), nothing was "
            "registered and the dataset can only be deleted. Uploads are `ready` at once."
        ),
    )
    registration_reason: str | None = Field(
        default=None,
        description=(
            "When `registration_status` is `failed`, shown to the owner only (it may name an "
            "object's location): why, naming the field (`uri` or `columns`) as the synchronous "
            "4xx answer did (never a data value)."
        ),
    )
    batch_status: Literal["registering", "failed"] | None = Field(
        default=None,
        description=(
            "A batch appended by reference (`POST /v1/dataset-references/{id}/batches`): "
            "`registering` while a worker reads and checks its objects (it is not a batch yet: "
            "n_rows, n_batches and every release leave it out until it is registered); "
            "`failed` when its objects were refused (see `batch_reason`; nothing was added, "
            "append again). Null when no batch is pending, and once the last one is registered "
            "(it then counts in n_batches)."
        ),
    )
    batch_reason: str | None = Field(
        default=None,
        description=(
            "When `batch_status` is `failed`: why, naming the field (`uri` or `columns`) as a "
            "registration's reason does (never a data value)."
        ),
    )
    privacy_unit: Literal["row", "person"] = Field(
        default="row",
        description=(
            "What the budget protects. `row`: neighbouring datasets replace one row, so a "
            "person with several rows is protected only at up to that many times epsilon "
            "(group privacy). `person`: the upload named a `privacy_unit_column`; neighbouring "
            "datasets differ in all rows of one person and every release bounds a person's "
            "total contribution (mechanisms without that argument are refused with 422)."
        ),
    )
    n_units: int | None = Field(
        default=None,
        description="`person`: the number of distinct people (units); public, like n_rows.",
    )


class DatasetCreated(Dataset):
    """The upload's answer: the dataset's metadata, and what only its owner sees once."""

    rows_above_bound: int | None = Field(
        default=None,
        description=(
            "How many uploaded rows have a norm above row_norm_bound: every clipping mechanism "
            "scales them down to it (issue 24). A fact about the owner's own rows, shown only "
            "in this response to the owner who uploaded them; never stored, logged or shown "
            "again. Null without a bound."
        ),
    )
    rows_per_unit: dict[str, int] | None = Field(
        default=None,
        description=(
            "With a privacy_unit_column: how many people have 1, 2-5, 6-20, 21-100 and over "
            "100 rows (coarse buckets). Like rows_above_bound, shown only in this response to "
            "the owner, who holds the rows; never stored, logged or shown to analysts."
        ),
    )
    rows_dropped_by_bound: int | None = Field(
        default=None,
        description=(
            "With a privacy_unit_column: rows the per-person bound drops. Always 0: a person's "
            "rows are scaled down together so that their total contribution is within the "
            "bound, never dropped."
        ),
    )

    recommended_accounting: Literal["basic", "gaussian", "zcdp", "hybrid"] | None = Field(
        default=None,
        description=(
            "The accounting that fits the mechanisms the upload named in planned_mechanisms "
            "(issue 31, item 5): hybrid, the default, when it named none; gaussian when all "
            "are purely Gaussian, basic when one of them only basic admits, zcdp otherwise; "
            "basic whatever the plan when delta_budget is so small that every share of a "
            "hybrid budget's delta rounds to 0 (1e-30 and below). Advice: the dataset "
            "keeps the accounting it was uploaded with."
        ),
    )
    recommendation_reason: str | None = Field(
        default=None, description="Why recommended_accounting fits, with the measured figures."
    )


class DatasetBatch(Schema):
    """A batch of rows appended to a dataset (`POST /v1/datasets/{id}/rows`)."""

    dataset_id: UUID = Field(description="The dataset the batch belongs to.")
    seq: int = Field(
        description="The batch's sequence number: 0 is the upload, appends count 1, 2, ..."
    )
    n_rows: int = Field(description="Rows in this batch; public.")
    n_rows_total: int = Field(description="Rows in the dataset with this batch; public.")
    n_batches: int = Field(description="Batches in the dataset with this batch.")
    created_at: datetime = Field(description="When the batch was committed (UTC).")


class DatasetList(Schema):
    """A page of datasets, newest first."""

    items: list[Dataset] = Field(description="The datasets on this page.")
    total: int = Field(description="How many datasets the caller sees in all pages.")
    next: str | None = Field(
        description=(
            "Opaque cursor of the next page: pass it unchanged as `cursor`. Null on the last "
            "page. With `offset` instead of `cursor`, also the cursor after this page."
        )
    )


class DatasetCreate(RequestSchema):
    """Form fields of `POST /v1/datasets` (sent as multipart form fields next to `file`).

    Budgets are decimal strings in ASCII digits ("1", "0.5", "1e-6"), with at most 30 decimal
    places: the ledger stores them exactly, never rounded.
    """

    name: Name = Field(description="A name for the dataset (1 to 200 characters, one line).")
    epsilon_budget: Annotated[
        StrictDecimal, Field(gt=0, le=1_000_000), number_schema(gt=0, le=1_000_000)
    ] = Field(description="Total epsilon all releases may spend (at most 30 decimal places).")
    delta_budget: Annotated[StrictDecimal, Field(ge=0, lt=1), number_schema(ge=0, lt=1)] = Field(
        description=(
            "Total delta all releases may spend, e.g. 1e-5 (0: pure DP, `basic` accounting; "
            "above 1/n only with allow_large_delta; at most 30 decimal places)."
        )
    )
    row_norm_bound: Annotated[StrictFloat, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None,
        description=(
            "Public bound C on row norms, the default clip norm of releases. Declare it from "
            "domain knowledge; it must not be computed from the data. Optional: without it "
            "every release must send its own `params.clip_norm` (refused with 422 otherwise)."
        ),
    )
    accounting: Accounting | None = Field(
        default=None,
        description=(
            "How releases compose: `hybrid` (a release is admitted when a Gaussian-DP filter on "
            "96% of delta, a zCDP filter on 3% or a basic filter on 1% admits the whole "
            "sequence: every mechanism runs, Gaussian releases within 0.8% of basic's noise at "
            "one release and of the PLD accountant's at 10 and 100), `basic` (sums of epsilon "
            "and delta), `gaussian` (a Gaussian-DP filter: only purely Gaussian mechanisms) or "
            "`zcdp` (an approximate-zCDP filter: every mechanism with a proven profile). "
            "Default: `basic` when delta_budget is 0, else the service's "
            "DPSS_DEFAULT_ACCOUNTING (`hybrid` unless the operator changed it)."
        ),
    )
    mu_budget: Annotated[StrictDecimal, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None,
        description=(
            "gaussian: a mu budget stated directly; at most the largest mu whose curve is "
            "within (epsilon_budget, delta_budget) (derived when absent)."
        ),
    )
    rho_budget: Annotated[StrictDecimal, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None,
        description=(
            "zcdp: a rho budget stated directly; at most the largest rho whose conversion is "
            "within (epsilon_budget, delta_conversion) (derived when absent)."
        ),
    )
    delta_conversion: (
        Annotated[StrictDecimal, Field(gt=0, lt=1), number_schema(gt=0, lt=1)] | None
    ) = Field(
        default=None,
        description=(
            "zcdp: the share of delta_budget reserved for converting rho to (epsilon, "
            "delta); releases' approximate steps may spend the rest. Default: half."
        ),
    )
    privacy_unit_column: (
        Annotated[str, Field(min_length=1, max_length=200)] | Annotated[int, Field(ge=0)] | None
    ) = Field(
        default=None,
        description=(
            "The column that identifies a person (the privacy unit) when a person may have "
            "several rows: a column name (CSV header, Parquet) or a 0-based column index (text "
            "of digits only is an index). The column is removed from the features and its "
            "values are never stored or shown; neighbouring datasets then differ in all rows "
            "of one person. Omitted: the unit is the row. An append's rows join the people "
            "already present with the same identifier, under the same per-person bound; "
            "datasets by reference with a person column are refused with 422."
        ),
    )
    planned_mechanisms: SafeStr | None = Field(
        default=None,
        max_length=1000,
        description=(
            "Optional: the mechanisms the owner plans to use, comma-separated names "
            "(`analyze_gauss,friendly_aggregate`); an unknown name is refused (422). Changes "
            "nothing about the dataset; an upload's answer (recommended_accounting) says which "
            "accounting fits them."
        ),
    )
    allow_large_delta: FormBool = Field(
        default=False,
        description=(
            "Accept a delta_budget above 1/n (n: the rows at upload or registration). Such a "
            "delta offers no protection (a mechanism that publishes one row in n at random is "
            "(0, 1/n)-DP), so it is refused (422 naming delta_budget) unless this is true. "
            "Appends do not re-check it: the bound is on the n at upload. A form field "
            '"true" or "false" (a JSON boolean for references).'
        ),
    )


class DatasetReferenceCreate(DatasetCreate):
    """JSON body of `POST /v1/dataset-references`: a Parquet dataset that stays where it
    is (object storage or a shared filesystem), with the budget fields of an upload.

    The service reads the objects with the deployment's credentials (never sent here), checks
    every value, and records each object's ETag (or version, or size and modification time)
    and the SHA-256 of the bytes releases read; a release finding an object changed ends
    `failed` and is refunded. An object another live dataset covers is refused (409).
    """

    uri: SafeStr = Field(
        min_length=1,
        max_length=1000,
        description=(
            "`s3://bucket/prefix/` (every `*.parquet` object under it, in key order; the "
            "endpoint is the deployment's) or an absolute path of a directory or file on a "
            "filesystem the service shares; it must lie under one of the service's "
            "DPSS_REFERENCE_ROOTS."
        ),
    )
    columns: list[ColumnName] = Field(
        min_length=1,
        description="The numeric columns to use, in this order: the dataset's d columns.",
    )


class DatasetReferenceBatchCreate(RequestSchema):
    """JSON body of `POST /v1/dataset-references/{id}/batches`: the Parquet object(s) of a new
    batch of a dataset registered by reference, under the rules of a registration.

    The batch is registered as the dataset was (every value read and checked, its objects'
    identities and digests recorded) before it counts; it then is the dataset's next batch,
    releases requested from then on read it, and a waiting continual release releases its next
    epoch from it.
    """

    uri: SafeStr = Field(
        min_length=1,
        max_length=1000,
        description=(
            "The new batch's objects, named as at registration: `s3://bucket/prefix/` or an "
            "object's key, or an absolute path of a directory or file, under one of the "
            "service's DPSS_REFERENCE_ROOTS, on the same kind of storage as the dataset "
            "(`s3` or a filesystem). No object may be one the dataset (or another live dataset) "
            "already covers, by name or by content: a URI that is such an object, or a prefix "
            "holding one (batch 0's prefix again, a prefix over an earlier batch's objects), is "
            "refused by the request (409 `object_registered`); a new prefix under batch 0's "
            "holding only new objects is fine."
        ),
    )
    columns: list[ColumnName] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Optional: the columns to read, which must be the dataset's own, in its order "
            "(the default); the batch's objects must hold them as numeric columns."
        ),
    )
