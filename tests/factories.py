"""Small factories for test data."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from alembic import command
from sqlalchemy import Engine, MetaData, create_engine, insert

from service.migrate import alembic_config


def near_subspace(
    rng: np.random.Generator, n: int, d: int, k: int, noise: float = 0.01, norm: float = 1.0
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``n`` rows near a random ``k``-dim subspace of R^d, row norms <= ``norm``; with its basis."""
    basis, _ = np.linalg.qr(rng.normal(size=(d, k)))
    rows = rng.normal(size=(n, k)) @ basis.T * (0.5 * norm / np.sqrt(k))
    rows += rng.normal(size=(n, d)) * noise / np.sqrt(d)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, norm / norms), basis


def hybrid_with_filter_c_closed(
    client: Any, owner_key: str, analyst_key: str, upload_dataset: Any, rng: np.random.Generator
) -> dict[str, Any]:
    """A ``hybrid`` dataset (200 x 6 rows near a plane, epsilon 1, delta 1e-5, bound 1) after
    two Gaussian releases (``analyze_gauss``, k 2, epsilon 0.05, delta 1e-6 each), admitted by
    filter A', which overspend filter C's 1% share of delta (1e-7): C is closed whatever epsilon
    it has left, so a pure release (delta 0, which A' and B cannot charge) is unaffordable.
    Returns the dataset's JSON. ``upload_dataset`` is the suite's fixture of that name."""
    data, _ = near_subspace(rng, 200, 6, 2)
    dataset: dict[str, Any] = upload_dataset(
        client, owner_key, data, epsilon_budget="1.0", delta_budget="1e-5",
        row_norm_bound=1.0, accounting="hybrid",
    )  # fmt: skip
    for _ in range(2):
        made = client.post(
            f"/v1/datasets/{dataset['id']}/releases",
            headers={"Authorization": f"Bearer {analyst_key}"},
            json={"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.05", "delta": "1e-6"},
        )
        assert made.status_code == 202, made.text
    return dataset


@dataclass(frozen=True)
class OldSchema:
    """A SQLite database migrated only to ``revision``, holding one dataset and one queued
    release inserted through the reflected (old) tables."""

    url: str
    engine: Engine
    tables: MetaData
    dataset_id: uuid.UUID
    release_id: uuid.UUID
    created_at: datetime


def old_schema_with_release(tmp_path: Path, revision: str) -> OldSchema:
    """Build :class:`OldSchema` at ``revision`` (for tests of the migrations after it)."""
    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    command.upgrade(alembic_config(url), revision)
    engine = create_engine(url)
    tables = MetaData()
    tables.reflect(engine)
    dataset_id, release_id = uuid.uuid4(), uuid.uuid4()
    now = datetime(2026, 11, 1)
    with engine.begin() as connection:
        connection.execute(
            insert(tables.tables["datasets"]).values(
                id=dataset_id.hex, name="d", n_rows=3, n_cols=2, epsilon_total="1",
                delta_total="0.00001", file_name="x.npy", created_at=now,
            )
        )  # fmt: skip
        connection.execute(
            insert(tables.tables["releases"]).values(
                id=release_id.hex, dataset_id=dataset_id.hex, mechanism="analyze_gauss", k=1,
                epsilon="0.1", delta="0.0000001", params="{}", request_hash="0" * 64,
                status="queued", refunded=False, attempts=0, created_at=now,
            )
        )  # fmt: skip
    return OldSchema(url, engine, tables, dataset_id, release_id, now)
