"""Fixtures: every test that touches the database runs on SQLite and on PostgreSQL.

Each test runs inside a transaction that is rolled back: the app's sessions join it through
savepoints (``join_transaction_mode="create_savepoint"``), so a route's commit is real to the
code under test and invisible afterwards. Tests that need several connections (concurrency,
separate worker processes) use ``committed_db`` instead, which empties the tables afterwards.

PostgreSQL: ``DPSS_TEST_POSTGRES_URL`` names a server database the tests may create databases
from (default: the local ``test`` database). Each xdist worker gets its own database, made by
Alembic. Set ``DPSS_TEST_SKIP_POSTGRES=1`` to run on SQLite only (never in CI).
"""

from __future__ import annotations

import io
import itertools
import logging.config
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, make_url, text
from sqlalchemy.orm import Session, sessionmaker
from threadpoolctl import threadpool_limits

from service import auth
from service import oneshot as oneshot_module
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine
from service.migrate import upgrade_to_head
from service.store import DatasetStore
from service.worker import Worker

# The sandbox (HOME, DPSS_DATA_DIR in a temporary directory) and the guard that fails the run
# when a test writes outside its temporary directories; and the loud summary of what skipped.
pytest_plugins = ["tests.sandbox"]


#: The longest tests (``--durations`` of a full ``-n 2`` run, 2026-11-29, 10-25 s each), longest
#: first. Collected first, they start first: xdist's load scheduling hands out tests in
#: collection order, so one of them collected late runs alone at the end while the other worker
#: idles. Every parametrization of a name is moved; the order of the rest is pytest's.
LONG_TESTS = (
    "tests/test_docs_sessions.py::"
    "test_every_recorded_output_of_the_cli_page_is_what_the_service_prints",
    "tests/api/test_metrics.py::test_several_api_processes_add_up_in_multiprocess_mode",
    "tests/continual/test_continual_processes.py::"
    "test_a_worker_killed_between_epochs_resumes_without_redrawing_or_recharging",
    "tests/mechanisms/test_histogram_aggregate.py::test_searched_width_release_audit_negative_control",
    "tests/mechanisms/test_friendly_aggregate.py::test_audit_negative_control_fails",
    "tests/api/test_docs_offline.py::test_docs_render_every_operation_offline",
    "tests/test_accounting_hybrid.py::test_gaussian_noise_within_one_percent_of_basic_and_five_of_pld",
    "tests/mechanisms/test_privacy_unit_auto.py::"
    "test_auto_person_level_audit_and_its_row_calibrated_control",
    "tests/test_readme.py::test_walkthrough_runs_against_dpss_serve",
    "tests/mechanisms/test_histogram_aggregate.py::test_searched_width_release_audit",
    "tests/mechanisms/test_friendly_aggregate.py::test_audit_passes",
    "tests/mechanisms/test_privacy_unit_centre.py::"
    "test_private_centre_person_level_audit_and_its_row_calibrated_control",
    "tests/mechanisms/test_gap_perturbation.py::test_projector_audit_negative_control_fails",
    "tests/test_hybrid_calibration.py::test_default_dataset_gaussian_noise_against_basic_and_pld",
    "tests/mechanisms/test_gap_perturbation.py::test_projector_audit_passes",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first (:data:`LONG_TESTS`); a stable sort, the same in every worker."""
    rank = {name: index for index, name in enumerate(LONG_TESTS)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("[", 1)[0], len(rank)))


POSTGRES_URL = os.environ.get(
    "DPSS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SKIP_POSTGRES = os.environ.get("DPSS_TEST_SKIP_POSTGRES") == "1"
# Services the tests start in subprocesses (dpss serve, workers) read their settings from the
# environment: the suite's uploads that name no accounting stay basic there too (the product
# default, hybrid, has its own tests).
os.environ.setdefault("DPSS_DEFAULT_ACCOUNTING", "basic")
BACKENDS = ["sqlite"] if SKIP_POSTGRES else ["sqlite", "postgresql"]
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One BLAS thread per xdist worker: threaded BLAS in each of several workers on few cores
    # oversubscribes the CPU and numerical tests slow down many times over.
    threadpool_limits(limits=1)

TABLES = (
    "ledger_entries",
    "release_bases",
    "release_states",
    "release_epochs",
    "dataset_batches",
    "dataset_reference_objects",
    "batch_moments",
    "releases",
    "grants",
    "datasets",
    "priors",
    "audit_events",
    "api_keys",
    "worker_heartbeats",
    "machine_rates",
    "restore_hold",
)


def _admin_execute(statement: str) -> None:
    server = make_url(POSTGRES_URL).render_as_string(hide_password=False)
    admin = make_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(statement))
    admin.dispose()


@pytest.fixture(scope="session")
def database_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A fresh SQLite file and a fresh PostgreSQL database for this test process, via Alembic."""
    urls = {"sqlite": f"sqlite:///{tmp_path_factory.mktemp('db') / 'dpss.sqlite3'}"}
    # One database per process (xdist workers, concurrent runs): none can drop another's.
    name = f"dpss_test_{os.getpid()}"
    if not SKIP_POSTGRES:
        _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _admin_execute(f'CREATE DATABASE "{name}"')
        urls["postgresql"] = (
            make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
        )
    for url in urls.values():
        upgrade_to_head(url)
    yield urls
    if not SKIP_POSTGRES:
        _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def engines(database_urls: dict[str, str]) -> Iterator[dict[str, Engine]]:
    engines = {name: make_engine(url) for name, url in database_urls.items()}
    yield engines
    for engine in engines.values():
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def session_factory(engines: dict[str, Engine], backend: str) -> Iterator[sessionmaker[Session]]:
    """Sessions inside one outer transaction that is rolled back after the test."""
    connection = engines[backend].connect()
    outer = connection.begin()
    factory = sessionmaker(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    )
    yield factory
    outer.rollback()
    connection.close()


def _empty_tables(engine: Engine) -> None:
    with engine.begin() as connection:
        for table in TABLES:
            connection.execute(text(f"DELETE FROM {table}"))
        connection.execute(
            text("UPDATE audit_head SET last_seq = 0, last_hash = :genesis WHERE id = 1"),
            {"genesis": "0" * 64},
        )


@pytest.fixture
def committed_db(
    engines: dict[str, Engine], database_urls: dict[str, str], backend: str
) -> Iterator[tuple[str, sessionmaker[Session]]]:
    """A database whose commits are real (for several connections or processes); emptied after."""
    engine = engines[backend]
    _empty_tables(engine)
    yield database_urls[backend], sessionmaker(bind=engine, expire_on_commit=False)
    _empty_tables(engine)


@pytest.fixture
def settings(tmp_path: Path, database_urls: dict[str, str], backend: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_urls[backend],
        worker_heartbeat_seconds=3600,
        max_upload_mb=5,
        admin_api_key=None,
        # No padding: tests see outcomes as soon as the worker stores them. The padding has
        # its own tests (tests/api/test_side_channels.py).
        release_padding_floor_seconds=0,
        release_padding_multiplier=0,
        rate_limit_per_second=0,
        # The suite's budgets and their figures predate accounting choices: uploads that name
        # none stay basic here (the product default, hybrid, has its own tests).
        default_accounting="basic",
        # Shedding on event-loop lag would depend on how busy the machine is; it has its own
        # tests (tests/api/test_overload.py) that set the lag by hand.
        api_max_loop_lag_seconds=0,
    )


@pytest.fixture
def store(settings: Settings) -> DatasetStore:
    store = DatasetStore(settings.datasets_dir)
    store.ensure()
    return store


@pytest.fixture
def app(settings: Settings, session_factory: sessionmaker[Session]) -> Any:
    return create_app(settings, session_factory=session_factory)


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def make_key(session_factory: sessionmaker[Session]) -> Callable[[str], str]:
    """``make_key(role) -> bearer secret`` for a new key of that role."""

    def make(role: str, name: str = "test") -> str:
        with session_factory.begin() as session:
            _, secret = auth.create_key(session, role, name, actor_key_id=None)  # type: ignore[arg-type]
        return secret

    return make


def install_log_config(config: dict[str, Any]) -> None:
    """``logging.config.dictConfig(config)``, leaving alone the handlers that others own.

    dictConfig first flushes and closes every handler alive in the process. In a service
    process that is the point; under pytest it also closes handlers that pytest or a library
    own. absl's handler (imported with dp-accounting) closes its stream, and when absl was
    first imported inside a test that stream is pytest's capture file: every later test of
    that xdist worker then failed with "I/O operation on closed file". The handlers the config
    names still replace the configured loggers' own.
    """
    with mock.patch.object(logging.config, "_clearExistingHandlers", lambda: None):
        logging.config.dictConfig(config)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def npy_bytes(array: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.fixture
def upload_dataset() -> Callable[..., dict[str, Any]]:
    """``upload_dataset(client, owner_key, array, **form) -> dataset JSON`` (asserts 201)."""

    def upload(
        client: TestClient, owner_key: str, array: np.ndarray[Any, Any], **form: Any
    ) -> dict[str, Any]:
        fields = {"name": "test", "epsilon_budget": "10", "delta_budget": "0.001", **form}
        if Decimal(str(fields["delta_budget"])) * array.shape[0] > 1:
            # The suite's budgets spend many small deltas on a few thousand rows; a delta above
            # 1/n needs the owner's override (tests/api/test_owner_mistakes.py has the bound).
            fields.setdefault("allow_large_delta", "true")
        response = client.post(
            "/v1/datasets",
            headers=bearer(owner_key),
            files={"file": ("data.npy", npy_bytes(array), "application/octet-stream")},
            data={key: str(value) for key, value in fields.items() if value is not None},
        )
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result

    return upload


@pytest.fixture
def worker(
    session_factory: sessionmaker[Session], store: DatasetStore, settings: Settings
) -> Worker:
    return Worker(session_factory, store, settings, worker_id="test-worker")


@pytest.fixture
def run_worker(worker: Worker) -> Callable[[], int]:
    """Process every queued release in-process; returns how many ran."""
    return worker.run_pending


@pytest.fixture
def refused_before_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every one-shot job ends ``failed`` and refunded, as a failure decided before any row is
    read (stored params that no longer parse) does: the refund route for tests about refunds.
    (A deletion no longer is one: a release ending after its dataset's deletion is never
    refunded, ``tests/api/test_deletion_race.py``.)"""
    from service.jobs import REFUSED_AT_RUN_REASON, Outcome
    from service.oneshot import OneShot

    refused = Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
    monkeypatch.setattr(OneShot, "run", lambda *_: refused)


@pytest.fixture(autouse=True)
def _seeded_releases(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked ``release_seed(n)`` give each release a seeded generator (``n``, ``n + 1``,
    ...) instead of the OS-keyed ChaCha, so statistical thresholds are reproducible in CI."""
    marker = request.node.get_closest_marker("release_seed")
    if marker is None:
        return
    seeds = itertools.count(marker.args[0])
    monkeypatch.setattr(
        oneshot_module, "secure_generator", lambda: np.random.default_rng(next(seeds))
    )


def post_release(client: TestClient, key: str, dataset_id: str, **body: Any) -> str:
    """Request a release (asserts 202); returns its id."""
    response = client.post(f"/v1/datasets/{dataset_id}/releases", headers=bearer(key), json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def fetch_release(client: TestClient, key: str, release_id: str) -> Any:
    return client.get(f"/v1/releases/{release_id}", headers=bearer(key)).json()


def release_and_wait(
    client: TestClient, key: str, dataset_id: str, run_worker: Callable[[], int], **body: Any
) -> Any:
    """Request a release, run the worker on it, return the finished release."""
    release_id = post_release(client, key, dataset_id, **body)
    assert run_worker() == 1
    return fetch_release(client, key, release_id)


@dataclass
class Keys:
    """One key of each role."""

    admin: str
    owner: str
    analyst: str
    auditor: str


@pytest.fixture
def keys(make_key: Callable[[str], str]) -> Keys:
    return Keys(*(make_key(role) for role in ("admin", "owner", "analyst", "auditor")))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
