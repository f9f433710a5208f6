"""Read-only views for the dashboard and operators: who a key is, the workers, the queue, a
dataset's ledger, the grants that apply to an analyst and the audit chain's verification."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal
from uuid import UUID

from pydantic import Field

from api_schemas.common import ExactDecimal, Schema
from api_schemas.grants import Grant
from api_schemas.keys import Role
from api_schemas.releases import PRIVACY_UNIT


class Whoami(Schema):
    """The key that made the request (any role)."""

    id: UUID = Field(description="Key id.")
    role: Role = Field(description="The key's role: which views and operations it may use.")
    name: str = Field(description="The key's label.")
    restore_unaccepted: str | None = Field(
        default=None,
        description="A restore from an older backup detected and not yet accepted "
        "(`dpss audit accept-restore`): what was found. Only admin and auditor keys get an "
        "answer meanwhile (every other key use is refused with 503 `restore_unaccepted`). "
        "Null: none.",
    )


class WorkerInfo(Schema):
    """A worker process, from the heartbeat it renews while it runs (busy or idle)."""

    worker_id: str = Field(description="The worker's id: host, process id and a random suffix.")
    started_at: datetime = Field(description="When the worker started (UTC).")
    last_seen_at: datetime = Field(description="Its last heartbeat (UTC).")
    alive: bool = Field(
        description="Whether it beat within `DPSS_WORKER_LEASE_SECONDS` (else it died unseen)."
    )
    running_release_id: UUID | None = Field(
        description="The release it holds the lease of, if it is running one."
    )


class WorkerList(Schema):
    """The workers seen in the last day, newest heartbeat first."""

    items: list[WorkerInfo] = Field(description="The workers.")
    total: int = Field(description="How many are listed.")
    alive: int = Field(description="How many of them are alive.")
    next: str | None = Field(
        default=None,
        description=(
            "Cursor of the next page, as on every list; always null: the workers seen in the "
            "last day come in one page."
        ),
    )


class QueuedJob(Schema):
    """A release waiting for or held by a worker (no parameters, no result)."""

    release_id: UUID = Field(description="Release id.")
    dataset_id: UUID = Field(description="The dataset it reads.")
    mechanism: str = Field(description="Mechanism name.")
    k: int = Field(description="Requested dimension.")
    status: Literal["queued", "running"] = Field(description="Waiting, or held by a worker.")
    attempts: int = Field(description="Claims so far (a retry after a lost worker adds one).")
    created_at: datetime = Field(description="Request time (UTC).")
    lease_owner: str | None = Field(description="The worker holding it, if running.")
    lease_expires_at: datetime | None = Field(
        description="When the lease runs out unless renewed (UTC), if running."
    )


class QueueState(Schema):
    """The job queue (the releases table) now."""

    queued: int = Field(description="Releases waiting for a worker.")
    running: int = Field(description="Releases held by a worker (continual ones included).")
    oldest_queued_at: datetime | None = Field(
        description="Request time of the oldest waiting release (UTC); null if none waits."
    )
    oldest_queued_age_seconds: float | None = Field(
        description="How long the oldest waiting release has waited, in seconds."
    )
    items: list[QueuedJob] = Field(description="The oldest jobs, at most 100, oldest first.")
    late: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "One-shot releases that ended after their visible_at (late), by mechanism, since the "
            "database began: their outcome showed at the next step of their public schedule "
            "(visible_at, then created_at + padding * 2^j). Many late releases mean a padding "
            "too short for this machine's load: restart the workers to recalibrate, or raise "
            "DPSS_RELEASE_PADDING_CALIBRATED_MULTIPLIER."
        ),
    )


class LedgerEntry(Schema):
    """One charge or refund of a dataset's budget."""

    id: int = Field(
        description=(
            "The entry's place in the dataset's ledger (1, 2, ...) in the order listed: by when "
            "it takes effect (a charge at its request, a refund when its release's outcome "
            "shows), then release id and kind. Not a global sequence: a refund's place is when "
            "it takes effect, not when a worker wrote it."
        )
    )
    release_id: UUID = Field(description="The release charged or refunded.")
    kind: Literal["charge", "refund"] = Field(description="A charge, or a refund of one.")
    epsilon: ExactDecimal = Field(
        description=(
            "basic: epsilon charged or refunded. gaussian, zcdp: 0 (they charge rho); see "
            "epsilon_increment for the entry in epsilon."
        )
    )
    delta: ExactDecimal = Field(description="Delta charged or refunded (mechanisms' delta).")
    rho: ExactDecimal = Field(
        default=Decimal(0),
        description="gaussian, zcdp: rho charged or refunded (gaussian: mu^2/2); 0 for basic.",
    )
    mu: ExactDecimal | None = Field(
        default=None, description="gaussian: the entry's mu, sqrt(2 rho) rounded up."
    )
    epsilon_after: ExactDecimal = Field(
        description=(
            "The dataset's net spend after this entry (ledger order) stated as its budget "
            "states epsilon_spent: the smallest epsilon at which it is (epsilon, delta_total)-DP "
            "at the dataset's delta_total (stated_at_delta), rounded up. basic: the running sum."
        )
    )
    epsilon_increment: ExactDecimal = Field(
        description=(
            "epsilon_after less the previous entry's: what this entry added (negative for a "
            "refund). Under gaussian and zcdp epsilons do not add up, so this depends on what "
            "was spent before; it is the step the dashboard's chart draws."
        )
    )
    grant_id: UUID | None = Field(
        description="The grant it is also charged to; null: the dataset's budget directly."
    )
    created_at: datetime = Field(description="When it was written (UTC).")


class LedgerPage(Schema):
    """A dataset's ledger, oldest first."""

    items: list[LedgerEntry] = Field(description="The entries on this page.")
    total: int = Field(description="How many entries the dataset's ledger holds.")
    accounting: Literal["basic", "gaussian", "zcdp", "hybrid"] = Field(
        description="The dataset's accounting: the entries' native currency."
    )
    stated_at_delta: ExactDecimal = Field(
        default=Decimal(0),
        description="The delta the epsilon figures are stated at: the dataset's delta_total.",
    )
    privacy_unit: Literal["row", "person"] = Field(default="row", description=PRIVACY_UNIT)
    next: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class MyGrantList(Schema):
    """For each dataset on which one applies, the grant an analyst's releases are charged to."""

    items: list[Grant] = Field(
        description="The caller's own active grant on a dataset, else its all-analysts grant."
    )
    total: int = Field(description="How many are listed.")
    next: str | None = Field(
        default=None,
        description=(
            "Cursor of the next page, as on every list; always null: one grant per dataset, "
            "in one page."
        ),
    )


class AuditVerification(Schema):
    """`dpss audit verify` run by the service now, in one consistent snapshot."""

    ok: bool = Field(description="True when no problem was found.")
    checked: int = Field(description="Events read.")
    problems: list[str] = Field(
        description="What is wrong, naming tables, events and ids (never a stored value)."
    )
    notes: list[str] = Field(description="What was checked beyond the chain, or could not be.")
    head: str = Field(description="The chain's last event as `SEQ:HASH` (`dpss audit head`).")
    anchor: str | None = Field(
        description="The anchored head (`DPSS_AUDIT_ANCHOR`), if the service has one."
    )
    anchor_found: bool | None = Field(
        description="Whether the chain still contains the anchored event with its hash; "
        "null without an anchor."
    )
    macs_checked: bool = Field(description="Whether event MACs were checked (the key is set).")
    restore_unaccepted: str | None = Field(
        default=None,
        description="A restore from an older backup detected against the audit anchors and "
        "not yet accepted by an admin (`dpss audit accept-restore`): what was found. While set, "
        "the API refuses charges and key use (503 `restore_unaccepted`). Null: none.",
    )
    verified_at: datetime = Field(description="When this check ran (UTC).")
