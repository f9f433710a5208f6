"""The budget read (``GET /v1/datasets/{id}/budget``) is one statement, with no ORM object
(:func:`service.datasets.get_budget`): the same answers as the dataset row and its ledger
sums read separately (:func:`service.ledger.budget_of`), the same visibility as the dataset's
metadata, and refunds counted only from when they take effect. Statements are counted with an
SQLAlchemy event, not timed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from service import auth, ledger
from service.api.presenters import budget_out
from service.app import create_app
from service.config import Settings
from service.db.models import Dataset, LedgerEntry, utcnow
from tests.api.test_read_cost import counted
from tests.conftest import Keys, bearer, post_release

DATA = np.random.default_rng(5).normal(size=(40, 4)) * 0.1
COSTS = {
    "basic": [{"epsilon": "0.25", "delta": "1e-9"}, {"epsilon": "0.125", "delta": "2e-9"}],
    "gaussian": [{"mu": "0.1"}, {"mu": "0.2"}],
    "zcdp": [{"rho": "0.001"}, {"rho": "0.002"}],
}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A key checked once is reused for the whole test, whatever the machine's pauses.
    return settings.model_copy(update={"auth_cache_seconds": 3600})


@pytest.fixture
def engine(engines: dict[str, Engine], backend: str) -> Engine:
    return engines[backend]


def refund_of(charge: LedgerEntry, *, hours: float, **columns: Any) -> LedgerEntry:
    """A refund of ``charge``'s epsilon, delta and rho (and ``columns``), in effect ``hours``
    from now: written by hand, so that a test sets when it takes effect."""
    return LedgerEntry(
        dataset_id=charge.dataset_id,
        release_id=charge.release_id,
        kind="refund",
        epsilon=charge.epsilon,
        delta=charge.delta,
        rho=charge.rho,
        created_at=utcnow() + timedelta(hours=hours),
        **columns,
    )


def budget_url(dataset_id: str) -> str:
    return f"/v1/datasets/{dataset_id}/budget"


def test_a_budget_read_with_a_known_key_is_one_statement(
    client: TestClient, engine: Engine, keys: Keys, upload_dataset: Callable[..., Any]
) -> None:
    dataset = upload_dataset(client, keys.owner, DATA, row_norm_bound="1")["id"]
    post_release(
        client, keys.analyst, dataset, mechanism="analyze_gauss", k=1, epsilon="0.5", delta="1e-9"
    )
    for key in (keys.owner, keys.analyst):
        assert client.get(budget_url(dataset), headers=bearer(key)).status_code == 200
        with counted(engine) as seen:
            response = client.get(budget_url(dataset), headers=bearer(key))
        assert response.status_code == 200, response.text
        assert Decimal(response.json()["epsilon_spent"]) == Decimal("0.5")
        selects = [s for s, _ in seen if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 1, seen


@pytest.mark.parametrize("kind", sorted(COSTS))
def test_the_budget_read_agrees_with_the_ledger_and_counts_refunds_once_in_effect(
    client: TestClient,
    keys: Keys,
    upload_dataset: Callable[..., Any],
    session_factory: sessionmaker[Session],
    kind: str,
) -> None:
    dataset = upload_dataset(
        client,
        keys.owner,
        DATA,
        epsilon_budget="2",
        delta_budget="1e-6",
        accounting=kind,
        row_norm_bound="1",
    )["id"]
    empty = client.get(budget_url(dataset), headers=bearer(keys.analyst)).json()
    released = [
        post_release(client, keys.analyst, dataset, mechanism="analyze_gauss", k=1, **cost)
        for cost in COSTS[kind]
    ]

    def expected() -> dict[str, Any]:
        with session_factory() as session:
            row = session.get(Dataset, uuid.UUID(dataset))
            assert row is not None
            return budget_out(row, ledger.budget_of(session, row)).model_dump(mode="json")

    charged = client.get(budget_url(dataset), headers=bearer(keys.analyst)).json()
    assert charged == expected() and charged != empty
    # Refunds of both charges: the first in effect an hour ago, the second in an hour (its
    # release's outcome not yet visible): only the first counts.
    with session_factory.begin() as session:
        for release, shift in zip(released, (-1, 1), strict=True):
            charge = session.execute(
                select(LedgerEntry).where(
                    LedgerEntry.release_id == uuid.UUID(release), LedgerEntry.kind == "charge"
                )
            ).scalar_one()
            session.add(refund_of(charge, hours=shift))
    for key in (keys.owner, keys.analyst):
        answer = client.get(budget_url(dataset), headers=bearer(key)).json()
        assert answer == expected()
        assert answer != charged
    only_second = answer
    # The same as a dataset charged the second release alone.
    with session_factory() as session:
        row = session.get(Dataset, uuid.UUID(dataset))
        assert row is not None
        second = session.execute(
            select(LedgerEntry).where(
                LedgerEntry.release_id == uuid.UUID(released[1]), LedgerEntry.kind == "charge"
            )
        ).scalar_one()
        alone = ledger.state_of(row, second.epsilon, second.delta, second.rho)
        assert only_second == budget_out(row, alone).model_dump(mode="json")


def test_a_hybrid_budget_read_agrees_with_the_ledger_and_a_refund_zeroes_its_release(
    client: TestClient,
    keys: Keys,
    upload_dataset: Callable[..., Any],
    session_factory: sessionmaker[Session],
) -> None:
    """hybrid's sums (every filter's, with the entries missing a GDP or zCDP figure counted)
    read the same in the one-statement read and in ``ledger.budget_of``, on both databases'
    shapes; a refund zeroes its release in every filter (its flags restored: ledger.refund's
    argument)."""
    dataset = upload_dataset(
        client,
        keys.owner,
        DATA,
        epsilon_budget="2",
        delta_budget="1e-6",
        accounting="hybrid",
        row_norm_bound="1",
    )["id"]
    costs: list[dict[str, Any]] = [
        {"mechanism": "analyze_gauss", "mu": "0.1"},  # A', B, C
        {"mechanism": "smooth_sensitivity", "epsilon": "0.1", "delta": "0"},  # pure: A'
        # the Gaussian smooth-sensitivity variant has no profile: only C (gdp, zcdp_delta null)
        {
            "mechanism": "smooth_sensitivity",
            "epsilon": "0.05",
            "delta": "1e-9",
            "params": {"noise": "gaussian"},
        },
    ]
    released = [post_release(client, keys.analyst, dataset, k=1, **cost) for cost in costs]

    def expected() -> dict[str, Any]:
        with session_factory() as session:
            row = session.get(Dataset, uuid.UUID(dataset))
            assert row is not None
            return budget_out(row, ledger.budget_of(session, row)).model_dump(mode="json")

    charged = client.get(budget_url(dataset), headers=bearer(keys.analyst)).json()
    assert charged == expected()
    with session_factory() as session:
        row = session.get(Dataset, uuid.UUID(dataset))
        assert row is not None
        state = ledger.budget_of(session, row)
        hybrid = state.hybrid()
        assert state.not_gdp == 1 and state.not_profiled == 1
        assert not hybrid.all_gdp and not hybrid.all_profiled
        assert state.gdp_spent > Decimal("0.01")  # mu 0.1 squared, and the pure step's
        entries = session.execute(
            select(LedgerEntry.gdp, LedgerEntry.zcdp_delta).order_by(LedgerEntry.id)
        ).all()
        assert [gdp is None for gdp, _ in entries] == [False, False, True]
        assert [zcdp is None for _, zcdp in entries] == [False, False, True]
    # Only C (basic) holds now: what was spent is its epsilon sum.
    assert Decimal(charged["epsilon_spent"]) == state.epsilon_spent
    with session_factory.begin() as session:
        charge = session.execute(
            select(LedgerEntry).where(
                LedgerEntry.release_id == uuid.UUID(released[2]), LedgerEntry.kind == "charge"
            )
        ).scalar_one()
        session.add(refund_of(charge, hours=-1, gdp=charge.gdp, zcdp_delta=charge.zcdp_delta))
    for key in (keys.owner, keys.analyst):
        answer = client.get(budget_url(dataset), headers=bearer(key)).json()
        assert answer == expected() != charged
    with session_factory() as session:
        row = session.get(Dataset, uuid.UUID(dataset))
        assert row is not None
        state = ledger.budget_of(session, row)
        # the release without a GDP figure or a profile is gone: A' and B hold again
        assert state.not_gdp == 0 and state.not_profiled == 0
        assert state.hybrid().all_gdp and state.hybrid().all_profiled
    assert Decimal(answer["epsilon_spent"]) < Decimal(charged["epsilon_spent"])


def test_the_budget_read_shows_what_the_metadata_shows(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    upload_dataset: Callable[..., Any],
) -> None:
    dataset = upload_dataset(client, keys.owner, DATA)["id"]
    other_owner = make_key("owner")
    expected = {
        keys.owner: 200,
        keys.analyst: 200,
        other_owner: 404,
        keys.auditor: 403,
        keys.admin: 403,
    }
    for key, status in expected.items():
        assert client.get(budget_url(dataset), headers=bearer(key)).status_code == status
        metadata = client.get(f"/v1/datasets/{dataset}", headers=bearer(key))
        assert metadata.status_code == status
    missing = client.get(budget_url(str(uuid.uuid4())), headers=bearer(keys.analyst))
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert client.get(budget_url(dataset), headers={}).status_code == 401
    deleted = client.delete(f"/v1/datasets/{dataset}", headers=bearer(keys.owner))
    assert deleted.status_code == 204
    for key in (keys.owner, keys.analyst):
        assert client.get(budget_url(dataset), headers=bearer(key)).status_code == 404


def _autocommit(connection: Any) -> bool:
    """Whether a statement on ``connection`` runs outside a transaction (called before it)."""
    dbapi = connection.connection.dbapi_connection
    if connection.dialect.name == "postgresql":
        return bool(dbapi.autocommit)
    return not dbapi.in_transaction  # SQLite: the service's own BEGIN IMMEDIATE came first


def test_only_the_budget_read_runs_outside_a_transaction_and_the_pool_stays_transactional(
    committed_db: tuple[str, sessionmaker[Session]],
    settings: Settings,
    backend: str,
    upload_dataset: Callable[..., Any],
) -> None:
    """On the app's own engine with one pooled connection: on PostgreSQL the budget read's
    statements run in autocommit (no BEGIN and COMMIT round trips); every other unit of work on
    the same connection afterwards, reads and writes, is a transaction again. SQLite (in
    process, no round trips) keeps a transaction for every unit of work."""
    url, factory = committed_db
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    own = settings.model_copy(update={"database_url": url, "db_pool_size": 1, "db_max_overflow": 0})
    with TestClient(create_app(own)) as client:
        engine = client.app.state.engine  # type: ignore[attr-defined]
        seen: list[tuple[str, bool]] = []

        def record(connection: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if not statement.upper().startswith("BEGIN"):
                seen.append((statement.split()[0].upper(), _autocommit(connection)))

        event.listen(engine, "before_cursor_execute", record)
        try:
            dataset = upload_dataset(client, owner, DATA, row_norm_bound="1")["id"]
            for _ in range(2):
                seen.clear()
                post_release(
                    client,
                    analyst,
                    dataset,
                    mechanism="analyze_gauss",
                    k=1,
                    epsilon="0.5",
                    delta="1e-9",
                )
                assert seen and not any(flag for _, flag in seen), seen
                seen.clear()
                response = client.get(budget_url(dataset), headers=bearer(analyst))
                assert response.status_code == 200, response.text
                outside = backend == "postgresql"
                assert seen and all(flag is outside for _, flag in seen), seen
                seen.clear()
                assert (
                    client.get(f"/v1/datasets/{dataset}", headers=bearer(analyst)).status_code
                    == 200
                )
                assert seen and not any(flag for _, flag in seen), seen
            assert Decimal(response.json()["epsilon_spent"]) == Decimal("1.0")
        finally:
            event.remove(engine, "before_cursor_execute", record)


def test_budgets_of_several_datasets_read_as_each_alone(
    client: TestClient,
    keys: Keys,
    upload_dataset: Callable[..., Any],
    session_factory: sessionmaker[Session],
) -> None:
    """The read of several datasets at once (listings; on SQLite the entries of all of them in
    one statement, grouped here) gives each the budget its own read and the one-statement read
    give: with entries, with none, and with a refund not yet in effect."""
    ids = []
    for accounting, costs in (("basic", COSTS["basic"]), ("zcdp", []), ("hybrid", [{"mu": "0.1"}])):
        dataset = upload_dataset(
            client,
            keys.owner,
            DATA,
            epsilon_budget="2",
            delta_budget="1e-6",
            accounting=accounting,
            row_norm_bound="1",
        )["id"]
        for cost in costs:
            post_release(client, keys.analyst, dataset, mechanism="analyze_gauss", k=1, **cost)
        ids.append(uuid.UUID(dataset))
    with session_factory.begin() as session:
        charge = (
            session.execute(select(LedgerEntry).where(LedgerEntry.dataset_id == ids[0]))
            .scalars()
            .first()
        )
        assert charge is not None
        session.add(refund_of(charge, hours=1))
    with session_factory() as session:
        rows = [session.get(Dataset, dataset_id) for dataset_id in ids]
        assert all(row is not None for row in rows)
        many = ledger.budgets_of(session, rows)  # type: ignore[arg-type]
        alone = {row.id: ledger.budget_of(session, row) for row in rows}  # type: ignore[union-attr]
        shown = {row.id: budget_out(row, many[row.id]).model_dump(mode="json") for row in rows}  # type: ignore[union-attr]
    assert many == alone
    assert many[ids[0]].epsilon_spent == Decimal("0.375")  # both charges, the refund not yet
    assert many[ids[1]].rho_spent == 0 and many[ids[2]].rho_spent > 0
    for dataset_id in ids:
        answer = client.get(budget_url(str(dataset_id)), headers=bearer(keys.owner)).json()
        assert answer == shown[dataset_id]
