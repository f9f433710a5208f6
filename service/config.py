"""The service's one configuration object, read from the environment (prefix ``DPSS_``)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Work units per second of a run-time model; positive so that a padding is always finite.
PositiveRate = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Settings(BaseSettings):
    """Every setting of the service. Environment variables are ``DPSS_<NAME>``.

    Sizing rule of one API process (see ``service.api.deps.Database``): at most
    ``db_pool_size + db_max_overflow`` units of work run at once, each on its own thread of a
    limiter of that size and holding one pooled connection for the whole of one thread call, so
    a unit of work never waits for a connection and never holds one while it waits for a thread,
    a client or a file. Requests beyond that wait up to ``db_wait_seconds`` without a connection,
    then get 503. ``api_threads`` serves the other blocking work (parsing uploads) and never
    holds a connection. Across a deployment, ``(api processes) x (db_pool_size +
    db_max_overflow + 1)`` plus the workers' connections must stay below the server's
    ``max_connections`` (the one: the API's ``LISTEN`` connection for long polls, see
    :mod:`service.waiters`).
    """

    model_config = SettingsConfigDict(env_prefix="DPSS_", extra="ignore")

    data_dir: Path = Field(
        default=Path("./dpss-data"),
        description="Directory for dataset files (and the default SQLite database).",
    )
    database_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL. Default: SQLite at <data_dir>/dpss.sqlite3. PostgreSQL: "
            "postgresql+psycopg://user:password@host:5432/dbname."
        ),
    )
    admin_api_key: SecretStr | None = Field(
        default=None,
        description="If set, an admin key with this secret exists from start-up (bootstrap).",
    )
    max_upload_mb: float = Field(default=1024, gt=0, description="Largest accepted upload, MiB.")
    max_json_bytes: int = Field(
        default=64 * 1024,
        gt=0,
        description=(
            "Largest accepted JSON request body, bytes. A larger one is refused with 413 from its "
            "Content-Length, or as soon as the bytes received exceed it, before anything parses it."
        ),
    )
    body_timeout_seconds: float = Field(
        default=300,
        gt=0,
        description=(
            "Time a client has to send a whole request body, counted from the first read; a "
            "slower body is cut with 408 and whatever it had sent is removed."
        ),
    )
    db_pool_size: int = Field(
        default=10,
        ge=1,
        description=(
            "Connections each API process keeps open. With db_max_overflow it sets how many "
            "units of work (one transaction in one thread call) run at once; see the sizing rule."
        ),
    )
    db_max_overflow: int = Field(
        default=5,
        ge=0,
        description=(
            "Extra connections an API process opens under load (closed when idle); at most "
            "db_pool_size + db_max_overflow units of work and connections per process."
        ),
    )
    db_pool_timeout_seconds: float = Field(
        default=2,
        gt=0,
        description=(
            "Wait for a pooled connection before 503. A safety net only: the API admits no more "
            "units of work than the pool has connections, so it does not wait in normal operation."
        ),
    )
    db_connect_timeout_seconds: int = Field(
        default=5,
        ge=2,
        description=(
            "PostgreSQL connect timeout, seconds (libpq's minimum is 2): an unreachable database "
            "host gives 503 after this long instead of hanging the request."
        ),
    )
    db_lock_timeout_seconds: float = Field(
        default=5,
        gt=0,
        le=3600,
        description=(
            "Longest time an API unit of work waits for a database lock (a row or table lock on "
            "PostgreSQL, its lock_timeout; the file's write lock on SQLite, its busy timeout) "
            "before it gives up and the request gets 503 with Retry-After. A lock held by "
            "another session (a maintenance job, an idle transaction, an outside SQLite writer) "
            "otherwise kept the request waiting, holding its connection, slot and thread, as "
            "long as that session chose (for ever on PostgreSQL, 60 s on SQLite)."
        ),
    )
    db_lock_attempt_seconds: float = Field(
        default=1.0,
        ge=0,
        le=3600,
        description=(
            "Longest time an API unit of work's first attempt waits for a dataset's row lock "
            "(PostgreSQL; its lock_timeout for that statement) before it gives the row up: the "
            "transaction rolls back, the request gives back its database slot and connection, "
            "pauses and tries again in attempts of at most 0.1 s, until db_lock_timeout_seconds "
            "have passed in all (then 503 with Retry-After). The first attempt is long enough "
            "that ordinary contention (other requests of the same dataset committing) is served "
            "in PostgreSQL's queue order; a row held longer (an outside session, maintenance) "
            "is then waited for without a slot, so requests to other datasets are not queued "
            "behind it. 0 turns this off (the wait is one statement, holding the slot). SQLite "
            "has no row locks: unused there."
        ),
    )
    db_wait_seconds: float = Field(
        default=10,
        gt=0,
        description=(
            "Time a request may queue, holding no connection, for one of the db_pool_size + "
            "db_max_overflow database slots of its process before it gets 503 with Retry-After."
        ),
    )
    db_max_queue_seconds: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Longest expected wait for a database slot a request may queue for. When every slot "
            "is taken and the requests queued ahead of it (shared among the slots, times the "
            "recent mean time a unit of work holds one) would make it wait longer, it gets 503 "
            "with Retry-After at once instead of after db_wait_seconds: overload is shed "
            "immediately. 0 sheds whenever every slot is taken."
        ),
    )
    api_max_loop_lag_seconds: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Longest pass of an API process's event loop (a moving mean, measured on requests) "
            "under which /v1 requests are served; above it, while at least 8 /v1 requests are "
            "in flight in the process (it is CPU-bound), a request gets 503 with Retry-After at "
            "once, before any database work (a slow pass with fewer is the host, not overload). "
            "0 turns this off."
        ),
    )
    api_head_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Seconds a client has to send a request's line and headers, from the connection (or "
            "from its first byte after a keep-alive pause); a slower head is answered 408 and "
            "the connection closed. Each connection holds one of the process's connection slots "
            "(bounded by its open files): without this, clients that connect and send a head "
            "byte by byte, or nothing (slowloris), held every slot for as long as they liked, "
            "and every other client got 503."
        ),
    )
    api_keep_alive_seconds: float = Field(
        default=75.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Seconds an API process keeps an idle keep-alive connection open. Longer than any "
            "Retry-After the service sends plus the event loop's lag under load, and than the "
            "idle timeout of a proxy in front (commonly 60 s): a connection the server closes "
            "while the client is sending its next request on it ends with no response at all "
            "(uvicorn's default of 5 s did so to clients coming back after a 503's Retry-After "
            "while the loop was seconds behind)."
        ),
    )
    auth_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description=(
            "How long an API process may reuse its verification of a key for reads (GET), "
            "saving a lookup per request. Writes always check the key in their own transaction. "
            "A revoked key stops working for reads at once in the API process that revoked it "
            "and at most this long later in every other one (other --workers, other hosts, "
            "`dpss keys revoke`). 0 checks the key on every request."
        ),
    )
    api_threads: int = Field(
        default=40,
        ge=1,
        description=(
            "Threads of an API process for blocking work that needs no connection (parsing "
            "uploads). Database work runs on its own db_pool_size + db_max_overflow threads."
        ),
    )
    retry_after_seconds: int = Field(
        default=2,
        ge=1,
        description=(
            "Seconds a 503 (database busy or unreachable) asks the client to wait, in the "
            "Retry-After header and the body's retry_after field."
        ),
    )
    release_wait_max_waiters: int = Field(
        default=100,
        ge=0,
        description=(
            "Requests of an API process that may wait at once in a long poll "
            "(GET /v1/releases/{id}?wait=...); beyond it a request is answered at once, as "
            "without wait. Waiting holds no connection, slot or thread, only the socket."
        ),
    )
    max_cols: int = Field(
        default=10_000,
        ge=1,
        description=(
            "Most columns (dimension d) an uploaded dataset may have; public. Checked from the "
            "first row, header or schema before any row is converted, so an upload's memory is "
            "bounded by this limit, not by the file."
        ),
    )
    max_dataset_bytes: int = Field(
        default=512 * 1024**2,
        ge=16,
        description=(
            "Largest decoded dataset, in bytes of float64 (rows x columns x 8), for an upload "
            "and for a dataset with an appended batch; public. Checked while decoding (from the "
            ".npy header or the Parquet footer before any row, as CSV rows are converted), so "
            "a small, highly compressible file cannot become a huge dataset: refused with 413. "
            "The default, 512 MiB, holds 70,000 x 784 (MNIST) with room; raise it for larger "
            "datasets (a float64 .npy decodes to its own size)."
        ),
    )
    reference_roots: str = Field(
        default="",
        description=(
            "Comma-separated roots a dataset registered by reference may lie under: "
            "s3://bucket/prefix and absolute paths of a filesystem the API, the workers and any "
            "Dask workers share. Empty (the default): registration by reference is off."
        ),
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description=(
            "Endpoint of the S3-compatible object storage of datasets by reference (e.g. "
            "http://minio:9000); unset: AWS. Credentials are never a setting: botocore reads "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role from the environment."
        ),
    )
    dask_scheduler: str | None = Field(
        default=None,
        description=(
            "Address of a Dask scheduler (tcp://host:8786): the heavy passes of releases on "
            "datasets by reference run there. Unset: in the worker process."
        ),
    )
    dask_pass_mb: float = Field(
        default=512,
        gt=0,
        description=(
            "Rows of the aggregators' subsets gathered per pass on the Dask cluster, MiB (spread "
            "over its workers, spilled by Dask beyond their memory target); each pass reads the "
            "dataset once. In process the pass is the worker's (512 MiB)."
        ),
    )
    dask_task_mb: float = Field(
        default=128,
        gt=0,
        description=(
            "Rows one task of a pass over a dataset by reference reads, MiB: consecutive row "
            "groups are read one after the other in one task until it holds about this much "
            "(a row group larger than it is a task of its own). Fewer, larger tasks spend "
            "less on scheduling and reuse their buffers across more row groups; memory stays "
            "one row group per task."
        ),
    )
    dask_retries: int = Field(
        default=2, ge=0, description="Retries of a failed Dask task before the release fails."
    )
    dask_connect_timeout_seconds: float = Field(
        default=10, gt=0, description="How long a worker waits to reach the Dask scheduler."
    )
    dask_wait_seconds: float = Field(
        default=60,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Longest time a release on a dataset by reference waits with no Dask worker on the "
            "cluster (before its first task, or after every worker left): past it the release "
            "ends failed and refunded instead of staying running until a worker returns."
        ),
    )
    reference_read_seconds: float = Field(
        default=900,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Longest registration of a dataset by reference (listing, reading and digesting "
            "every object), seconds, checked between reads: past it the registration is "
            "refused (422 naming `uri`)."
        ),
    )
    worker_lease_seconds: float = Field(
        default=30,
        gt=0,
        description="A claimed job is reclaimable this long after the last heartbeat.",
    )
    worker_heartbeat_seconds: float = Field(
        default=10, gt=0, description="How often a worker renews the lease of its running job."
    )
    worker_poll_seconds: float = Field(
        default=1.0, gt=0, description="How often an idle worker looks for queued jobs."
    )
    worker_wake: bool = Field(
        default=True,
        description=(
            "Wake idle workers as soon as a release is queued (PostgreSQL LISTEN/NOTIFY; a wake "
            "file in the data directory with SQLite) instead of at their next poll. Wake-ups "
            "are hints: with false, or when they fail, workers find jobs by polling."
        ),
    )
    worker_max_attempts: int = Field(
        default=3, ge=1, description="Claims of one job before it is marked failed."
    )
    worker_db_retry_initial_seconds: float = Field(
        default=0.5,
        gt=0,
        description=(
            "A worker's first wait after a database error in claim, heartbeat or finish; the "
            "wait doubles on each further error up to DPSS_WORKER_DB_RETRY_MAX_SECONDS."
        ),
    )
    worker_db_retry_max_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Longest wait between a worker's database retries: a worker resumes at most this "
            "long after the database is back."
        ),
    )
    worker_db_lock_timeout_seconds: float = Field(
        default=10,
        gt=0,
        le=3600,
        description=(
            "Longest time a worker's statement waits for a database lock another session holds "
            "(PostgreSQL's lock_timeout; SQLite's busy timeout). The statement then fails as an "
            "outage: its transaction rolls back, releasing the rows it had locked, and the "
            "worker retries with DPSS_WORKER_DB_RETRY_* backoff and logs the outage once. "
            "Without a bound a worker behind an idle-in-transaction session waited for ever on "
            "PostgreSQL, holding its connection, its lease and the rows it had locked, and did "
            "not stop on SIGTERM."
        ),
    )
    worker_memory_mb: float = Field(
        default=6144,
        gt=0,
        description=(
            "Working memory a worker may use for one release, MiB. A release whose estimate "
            "(from n, d, k and params: public facts) exceeds it is refused with 422 before "
            "anything is charged. The default fits a 2-core, 8 GiB worker."
        ),
    )
    audit_hmac_key: SecretStr | None = Field(
        default=None,
        description=(
            "If set (at least 32 characters, e.g. `openssl rand -hex 32`), every audit event is "
            "MACed with it, and `dpss audit verify` checks the MACs: someone who can write the "
            "database but not read this key cannot forge a consistent chain. Give the same key "
            "to the API, every worker and `dpss audit verify`."
        ),
    )
    audit_anchor: str | None = Field(
        default=None,
        description=(
            "A head printed earlier by `dpss audit head` (`SEQ:HASH`), kept outside the "
            "database; `dpss audit verify` then fails if the chain no longer contains it (a "
            "removed tail, a rewritten chain, a restore from an older backup)."
        ),
    )

    audit_anchor_path: Path | None = Field(
        default=None,
        description=(
            "File the workers append the audit head to (JSON lines: time, seq, hash and, with "
            "`DPSS_AUDIT_HMAC_KEY`, a MAC) every `DPSS_AUDIT_ANCHOR_INTERVAL_SECONDS` when it "
            "changed; `dpss audit verify` checks the chain against every anchor in it, so a "
            "database restored from an older backup fails. Default: "
            "<data_dir>-state/audit-anchors.jsonl, a sibling of the data directory, so that a "
            "backup of the data directory does not carry (and a restore of it does not roll "
            "back) the anchors; best on another volume than the database and its backups."
        ),
    )
    audit_anchor_url: str | None = Field(
        default=None,
        description=(
            "If set, each anchor line is also POSTed (JSON) to this URL (a log collector "
            "outside the host): a copy an operator who restores the host cannot roll back."
        ),
    )
    audit_anchor_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        allow_inf_nan=False,
        description="How often a worker anchors the audit head, seconds; 0 turns anchoring off.",
    )

    @property
    def trusted_proxy_list(self) -> list[str]:
        """:attr:`trusted_proxies` split at commas, blanks dropped."""
        return [proxy.strip() for proxy in self.trusted_proxies.split(",") if proxy.strip()]

    @property
    def reference_root_list(self) -> list[str]:
        """:attr:`reference_roots` split at commas, blanks dropped."""
        return [root.strip() for root in self.reference_roots.split(",") if root.strip()]

    @field_validator(
        "audit_hmac_key",
        "audit_anchor",
        "audit_anchor_url",
        "audit_anchor_path",
        "dask_scheduler",
        "s3_endpoint_url",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose passes `${VAR:-}` as an empty string when the operator sets nothing.
        return None if value == "" else value

    @field_validator("audit_hmac_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        # Anyone who reads the database holds (hash, MAC) pairs to test guesses against offline.
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters")
        return value

    release_padding_floor_seconds: float = Field(
        default=5,
        ge=0,
        description=(
            "Smallest padding, in seconds, between a release request and the moment an analyst "
            "may see its outcome (visible_at = created_at + padding). Hides run times below it."
        ),
    )
    release_padding_multiplier: float = Field(
        default=4,
        ge=0,
        description=(
            "Safety factor on the modelled run time: padding = max(floor, multiplier * work / "
            "rate), from public facts only (mechanism, n, d, k, resolved params)."
        ),
    )
    release_padding_rates: dict[str, PositiveRate] = Field(
        default_factory=dict,
        description=(
            "JSON object of per-mechanism overrides of the run-time model's rate, in work units "
            '(about floating-point operations) per second, e.g. {"exact_gapmax": 2e6}; '
            "mechanisms not named keep the defaults in service/padding.py. Lower is slower "
            "hardware and a longer padding."
        ),
    )
    release_padding_calibrated: bool = Field(
        default=True,
        description=(
            "Whether the padding tracks the rates workers measured on this machine (public "
            "random data, table machine_rates) once there are any: padding = calibrated floor "
            "+ queue + calibrated multiplier * work / measured rate. False: the defaults only. "
            "Mechanisms named in DPSS_RELEASE_PADDING_RATES always use the operator's rate."
        ),
    )
    release_padding_calibrated_floor_seconds: float = Field(
        default=0.25,
        ge=0,
        description=(
            "Constant part of a calibrated padding, seconds: what the workers' overhead probe "
            "does not time (an idle worker's wake-up). Start-up, loading and storing are timed "
            "by the probe (DPSS_RELEASE_PADDING_OVERHEAD_MULTIPLIER)."
        ),
    )
    release_padding_overhead_multiplier: float = Field(
        default=2.0,
        ge=1,
        description=(
            "Safety factor on the per-job overhead the workers time on public random data "
            "(fork, reading the dataset file, database round trips) in a calibrated padding."
        ),
    )
    release_padding_calibrated_multiplier: float = Field(
        default=2.5,
        ge=1,
        description=(
            "Safety factor on the measured run time in a calibrated padding (covers load "
            "beyond the calibration's and the model's error between calibrated shapes: a run "
            "under twice the cores' load took up to 1.8x its calibrated time)."
        ),
    )
    worker_blas_threads: int = Field(
        default=1,
        ge=0,
        description=(
            "BLAS threads of a worker's runs and calibration (0: the library's default, one per "
            "core). One: under contention a threaded OpenBLAS eigendecomposition waits for its "
            "descheduled threads (d = 784: 23-33 s against 4 s single-threaded at load 16 on 2 "
            "cores), which no padding calibrated at another moment covers; scale out with "
            "worker processes instead."
        ),
    )
    worker_calibrate_seconds: float = Field(
        default=300,
        ge=0,
        description=(
            "0: workers never calibrate (the padding keeps the public default rates). Any other "
            "value: each worker times the mechanisms on public random data once, at its start, "
            "before it claims a job, and stores the rates for the padding (restart it to "
            "recalibrate). No longer periodic: an idle worker's recalibration changed new "
            "releases' padding when other jobs ended (issue 30)."
        ),
    )
    rate_limit_per_second: float = Field(
        default=50,
        ge=0,
        description=(
            "Sustained requests per second allowed per API key (per client address for "
            "requests without a key) on /v1, in each API process; 0 turns rate limiting off. "
            "Excess requests get 429 with Retry-After."
        ),
    )
    rate_limit_burst: int = Field(
        default=100,
        ge=1,
        description="Requests a key may make at once before the per-second rate applies.",
    )
    rate_limit_unverified_per_second: float = Field(
        default=5,
        ge=0,
        description=(
            "Sustained requests per second per client address on /v1 without a valid key (no "
            "key, an unknown, random or revoked one), in each API process; 0: no such limit. "
            "Checked before the body is read, against the valid keys' digests held in memory."
        ),
    )
    rate_limit_unverified_burst: int = Field(
        default=20,
        ge=1,
        description="Such requests a client address may make at once before its rate applies.",
    )
    rate_limit_unverified_global_per_second: float = Field(
        default=50,
        ge=0,
        description=(
            "Sustained requests per second on /v1 without a known key from all addresses "
            "together, in each API process (burst: one second's worth); 0: no such limit. "
            "Keys already seen to authenticate are not affected."
        ),
    )
    trusted_proxies: str = Field(
        default="",
        description=(
            "Comma-separated addresses (or CIDR ranges) of reverse proxies whose "
            "X-Forwarded-For / X-Forwarded-Proto headers the API believes; the client address "
            "of a request (its rate-limit identity) is then the one the proxy forwarded. Empty "
            "(the default): no forwarding header is believed, from anyone, not even 127.0.0.1, "
            "so a client cannot choose its own address with a header. Set it to the proxy's "
            "address when one fronts the API (e.g. the Compose network's proxy)."
        ),
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description=(
            "Origins allowed to call the API from a browser (CORS), as a JSON list, e.g. "
            '["https://notebooks.example.org"]. Empty (default): no CORS headers at all.'
        ),
    )
    default_accounting: Literal["basic", "gaussian", "zcdp", "hybrid"] = Field(
        default="hybrid",
        description=(
            "The accounting of an uploaded dataset with delta_budget > 0 whose upload names "
            "none (pure budgets are always basic). hybrid (default): a release is admitted iff "
            "one of three filters admits the whole sequence with it, a Gaussian-DP filter on "
            "96% of delta (Gaussian and pure steps), zcdp on 3% and basic on 1%; every "
            "mechanism runs, one Gaussian release gets at most 1.008x basic's noise and 10 or "
            "100 Gaussian releases at most 1.008x the PLD accountant's (eps 0.1 to 8, delta "
            "1e-8 to 1e-3). zcdp: every mechanism with a proven profile, 1.08x to 1.23x PLD's "
            "noise. gaussian: equals PLD but admits only purely Gaussian mechanisms. basic: "
            "sums of (epsilon, delta). See docs/mechanisms.md, 'Accounting across releases'."
        ),
    )
    grants_required: bool = Field(
        default=False,
        description=(
            "Whether an analyst needs a grant to spend a dataset's budget. False (default): an "
            "analyst without a grant on the dataset spends its budget directly, as before grants "
            "existed. True: such a request is refused with 403 grant_required."
        ),
    )
    log_level: str = Field(
        default="INFO",
        description=(
            "Log level. Logs are JSON lines on stderr with a request id, never keys, bodies, "
            "exception messages or SQL parameters."
        ),
    )

    @property
    def db_slots(self) -> int:
        """Units of work one API process runs at once: one connection and one thread each."""
        return self.db_pool_size + self.db_max_overflow

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'dpss.sqlite3').resolve()}"

    @property
    def resolved_audit_anchor_path(self) -> Path:
        if self.audit_anchor_path is not None:
            return self.audit_anchor_path
        # Outside the data directory: a copy of it taken as a backup must not hold the anchors,
        # or restoring it would restore anchors as old as the database and hide the restore.
        data_dir = self.data_dir.resolve()
        return data_dir.parent / f"{data_dir.name}-state" / "audit-anchors.jsonl"

    @property
    def legacy_audit_anchor_path(self) -> Path:
        """Where the anchors were by default before they left the data directory: still read
        (never written), so that an upgrade keeps their history."""
        return self.data_dir / "audit-anchors.jsonl"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)
