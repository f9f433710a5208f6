"""The service's one configuration object, read from the environment (prefix ``DPSS_``)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting of the service. Environment variables are ``DPSS_<NAME>``."""

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
    max_cols: int = Field(
        default=10_000,
        ge=1,
        description=(
            "Most columns (dimension d) an uploaded dataset may have; public. Checked from the "
            "first row, header or schema before any row is converted, so an upload's memory is "
            "bounded by this limit, not by the file."
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
    worker_max_attempts: int = Field(
        default=3, ge=1, description="Claims of one job before it is marked failed."
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
    log_level: str = Field(default="INFO", description="Log level of the service's own loggers.")

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'dpss.sqlite3').resolve()}"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)
