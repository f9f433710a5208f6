"""service.db.prepared: a statement run on the driver's cursor reads and writes what
``Connection.execute`` does, on both databases, and keeps its events and error types."""

from __future__ import annotations

import typing
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Table, bindparam, event, insert, select, update
from sqlalchemy.exc import IntegrityError, NoResultFound
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import Dataset, Release
from service.db.prepared import Prepared

RELEASES = typing.cast(Table, Release.__table__)
DATASETS = typing.cast(Table, Dataset.__table__)


def _dataset_and_release(session: Session) -> tuple[uuid.UUID, uuid.UUID]:
    dataset_id, release_id = uuid.uuid4(), uuid.uuid4()
    created = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    session.add(
        Dataset(
            id=dataset_id,
            name="d",
            n_rows=10,
            n_cols=3,
            row_norm_bound=1.0,
            epsilon_total=Decimal("10"),
            delta_total=Decimal("0.001"),
            file_name="f.npy",
            created_at=created,
        )
    )
    session.flush()
    session.execute(
        insert(RELEASES),
        {
            "id": release_id,
            "dataset_id": dataset_id,
            "mechanism": "analyze_gauss",
            "k": 2,
            "epsilon": "1.5",
            "delta": "0.000001",
            "cost_rho": "0.25",
            "cost_delta": "0",
            "params": {"a": [1, 2.5, None], "b": {"c": "é"}},
            "status": "queued",
            "request_hash": "h",
            "attempts": 0,
            "refunded": False,
            "created_at": created,
            "visible_at": created + timedelta(seconds=3),
        },
    )
    return dataset_id, release_id


LOOK = (
    select(
        RELEASES.c.id,
        RELEASES.c.params,
        RELEASES.c.epsilon,
        RELEASES.c.created_at,
        RELEASES.c.mechanism,
        DATASETS.c.id.label("dataset_found"),
    )
    .outerjoin(DATASETS, DATASETS.c.id == RELEASES.c.dataset_id)
    .where(
        RELEASES.c.id == bindparam("release_id"),
        RELEASES.c.mechanism.in_(["analyze_gauss", "other"]),  # an expanding parameter
    )
)


def test_rows_read_as_connection_execute_reads_them(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        dataset_id, release_id = _dataset_and_release(session)
        connection = session.connection()
        expected = connection.execute(LOOK, {"release_id": release_id}).one()
        row = Prepared(LOOK).one(connection, {"release_id": release_id})
        assert tuple(row) == tuple(expected)
        assert row.id == release_id and isinstance(row.id, uuid.UUID)
        assert row.params == {"a": [1, 2.5, None], "b": {"c": "é"}}
        assert row.created_at == expected.created_at and row.created_at.tzinfo is not None
        assert row.dataset_found == dataset_id
        with pytest.raises(AttributeError):
            row.nothing  # noqa: B018
        assert Prepared(LOOK).first(connection, {"release_id": uuid.uuid4()}) is None
        with pytest.raises(NoResultFound):
            Prepared(LOOK).one(connection, {"release_id": uuid.uuid4()})


def test_writes_land_as_connection_execute_writes_them(
    session_factory: sessionmaker[Session],
) -> None:
    write = Prepared(update(RELEASES).where(RELEASES.c.id == bindparam("id_")))
    with session_factory.begin() as session:
        _, release_id = _dataset_and_release(session)
        connection = session.connection()
        finished = datetime(2026, 2, 3, 4, 5, 6, 7, tzinfo=UTC)
        # One plan per set of columns: two different SET clauses on one object.
        assert write.run(connection, {"id_": release_id, "status": "succeeded"}) == 1
        assert (
            write.run(
                connection,
                {"id_": release_id, "finished_at": finished, "result_extras": {"x": 1.25}},
            )
            == 1
        )
        assert write.run(connection, {"id_": uuid.uuid4(), "status": "failed"}) == 0
        row = connection.execute(
            select(RELEASES.c.status, RELEASES.c.finished_at, RELEASES.c.result_extras).where(
                RELEASES.c.id == release_id
            )
        ).one()
        assert tuple(row) == ("succeeded", finished, {"x": 1.25})


def test_events_fire_and_errors_are_sqlalchemy_s(
    session_factory: sessionmaker[Session],
) -> None:
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(args[2])

    with session_factory.begin() as session:
        _, release_id = _dataset_and_release(session)
        connection = session.connection()
        event.listen(connection, "before_cursor_execute", count)
        try:
            Prepared(LOOK).all(connection, {"release_id": release_id})
            duplicate = Prepared(insert(RELEASES))
            values = {
                c.name: v
                for c, v in zip(
                    RELEASES.c,
                    connection.execute(select(RELEASES).where(RELEASES.c.id == release_id)).one(),
                    strict=True,
                )
            }
            with pytest.raises(IntegrityError), session.begin_nested():
                duplicate.run(session.connection(), values)
        finally:
            event.remove(connection, "before_cursor_execute", count)
        assert len([s for s in seen if s.startswith("SELECT releases.id, releases.params")]) == 1
        assert any(s.startswith("INSERT INTO releases") for s in seen)
