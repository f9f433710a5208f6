"""Registration by reference as a job the owner polls (issue 30, item 8): the POST answers 202
with the dataset ``registering`` before reading anything; a worker reads, digests and checks
the objects under a lease and ends it ``ready`` or ``failed`` in one transaction; until
``ready`` the dataset takes no release, grant, batch or dry run (409 ``dataset_not_ready``)."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from dpss_client import Client, RegistrationFailed, cli_common
from dpss_client import handles as handles_module
from dpss_client.remote_cli import ExitCode, make_app
from service import audit, registration
from service.config import Settings
from service.db.models import AuditEvent, Dataset, DatasetReferenceObject, utcnow
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.reference import helpers

BUDGET = helpers.FILE_BUDGET
RELEASE = helpers.FILE_RELEASE


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(update={"reference_roots": str(root)})


def parquet(path: Path, rows: np.ndarray[Any, Any]) -> list[str]:
    names = [f"c{i}" for i in range(rows.shape[1])]
    pq.write_table(pa.table({n: rows[:, i] for i, n in enumerate(names)}), path)
    return names


def post(client: TestClient, key: str, uri: str, columns: list[str]) -> Any:
    body = {**BUDGET, "uri": uri, "columns": columns}
    return client.post("/v1/dataset-references", headers=bearer(key), json=body)


def show(client: TestClient, key: str, dataset_id: str) -> Any:
    return client.get(f"/v1/datasets/{dataset_id}", headers=bearer(key)).json()


def refusals(client: TestClient, keys: Keys, dataset_id: str) -> list[Any]:
    """A release, a dry run, a grant and an append on the dataset."""
    path = f"/v1/datasets/{dataset_id}"
    return [
        client.post(f"{path}/releases", headers=bearer(keys.analyst), json=RELEASE),
        client.post(f"{path}/releases?dry_run=true", headers=bearer(keys.analyst), json=RELEASE),
        client.post(
            f"{path}/grants", headers=bearer(keys.owner), json={"epsilon": "1", "delta": "1e-5"}
        ),
        client.post(
            f"{path}/rows",
            headers=bearer(keys.owner),
            files={"file": ("x.csv", b"1,2,3\n4,5,6\n", "text/csv")},
        ),
    ]


def test_registration_answers_at_once_and_a_worker_makes_it_ready(
    client: TestClient,
    keys: Keys,
    root: Path,
    worker: Worker,
    session_factory: sessionmaker[Session],
) -> None:
    rows = np.random.default_rng(1).normal(size=(300, 3)) / 4
    names = parquet(root / "set" / "a.parquet", rows)
    posted = post(client, keys.owner, str(root / "set"), names)
    assert posted.status_code == 202, posted.text
    body = posted.json()
    assert body["registration_status"] == "registering" and body["n_rows"] == 0
    assert body["n_cols"] == 3 and body["reference"] == str(root / "set")
    assert body["registration_reason"] is None
    for refused in refusals(client, keys, body["id"]):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "dataset_not_ready"
        assert "still registering" in refused.json()["detail"]
    # Analysts see the dataset once it is ready (its owner all along).
    path = f"/v1/datasets/{body['id']}"
    assert client.get(path, headers=bearer(keys.analyst)).status_code == 404
    assert client.get(f"{path}/budget", headers=bearer(keys.analyst)).status_code == 404
    assert client.get("/v1/datasets", headers=bearer(keys.analyst)).json()["total"] == 0
    assert show(client, keys.owner, body["id"])["registration_status"] == "registering"
    assert worker.run_pending() == 0  # no release ran; the registration did
    ready = show(client, keys.owner, body["id"])
    assert ready["registration_status"] == "ready" and ready["n_rows"] == 300, ready
    # The same to an analyst, but for the URI: where the rows are is the owner's.
    assert ready["reference"] == str(root / "set") and ready["by_reference"] is True
    assert show(client, keys.analyst, body["id"]) == {**ready, "reference": None}
    release_id = post_release(client, keys.analyst, body["id"], **RELEASE)
    assert worker.run_pending() == 1
    assert fetch_release(client, keys.analyst, release_id)["status"] == "succeeded"
    with session_factory() as session:
        kinds = [
            e.event_type
            for e in session.query(AuditEvent).order_by(AuditEvent.seq)
            if e.dataset_id == uuid.UUID(body["id"])
        ]
        referenced = [
            e.details for e in session.query(AuditEvent) if e.event_type == "dataset_referenced"
        ]
        report = audit.verify(session)
    assert kinds[:4] == [
        "dataset_created",
        "budget_set",
        "dataset_registration_requested",
        "dataset_referenced",
    ], kinds
    assert referenced[0]["n_rows"] == 300
    assert report.ok, report.problems


@pytest.mark.parametrize("fault", ["nan", "missing-column", "fifo"])
def test_a_refusal_found_by_reading_fails_the_registration_with_its_reason(
    fault: str,
    client: TestClient,
    keys: Keys,
    root: Path,
    session_factory: sessionmaker[Session],
) -> None:
    """What the POST answered 4xx when it read the objects itself is now the reason of a
    ``failed`` registration; the POST never reads (a FIFO under the URI cannot hang it)."""
    rows = np.random.default_rng(2).normal(size=(200, 2)) / 4
    names = ["c0", "c1"]
    if fault == "nan":
        rows[120, 1] = np.nan
    parquet(root / "set" / "a.parquet", rows)
    if fault == "missing-column":
        names = ["c0", "nope"]
    if fault == "fifo":
        os.mkfifo(root / "set" / "b.parquet")
    posted = post(client, keys.owner, str(root / "set"), names)
    assert posted.status_code == 202, posted.text
    dataset_id = posted.json()["id"]
    assert helpers.run_registrations(client) == 1
    reason = helpers.refusal(client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner)))
    expected = {
        "nan": "uri: " + str(root / "set" / "a.parquet") + ": non-finite value",
        "missing-column": "columns: 'nope' is not a column of",
        "fifo": "uri: " + str(root / "set" / "b.parquet") + " is not a regular file",
    }[fault]
    assert reason.startswith(expected), reason
    assert "nan" not in reason.lower().replace("non-finite value (nan", "")  # no value quoted
    for refused in refusals(client, keys, dataset_id):
        assert refused.status_code == 409 and "registration failed" in refused.text, refused.text
        assert reason not in refused.text
    # The reason is the owner's: analysts do not see a failed dataset.
    analyst_view = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.analyst))
    assert analyst_view.status_code == 404
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == 0
        failed = [
            e.details
            for e in session.query(AuditEvent)
            if e.event_type == "dataset_registration_failed"
        ]
        assert failed == [{"reason": reason}]
        assert audit.verify(session).ok
    # The owner deletes it; the objects may then be registered (and fixed) again.
    deleted = client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner))
    assert deleted.status_code == 204


def test_what_needs_no_read_is_refused_by_the_post(
    client: TestClient, keys: Keys, root: Path, tmp_path: Path
) -> None:
    names = parquet(root / "set" / "a.parquet", np.zeros((10, 2)))
    for uri, columns, status, field in [
        (str(tmp_path / "elsewhere"), names, 422, "uri"),
        ("relative/path", names, 422, "uri"),
        (str(root / "set"), [], 422, "columns"),
        (str(root / "set"), ["c0", "c0"], 422, "columns"),
    ]:
        response = post(client, keys.owner, uri, columns)
        assert response.status_code == status, (uri, response.text)
        assert response.json()["detail"].startswith(field), response.text
    # A column name's length is counted as a string's (not "at most 200 items").
    response = post(client, keys.owner, str(root / "set"), ["x" * 201])
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "columns.0: String should have at most 200 characters"
    listed = client.get("/v1/datasets", headers=bearer(keys.owner)).json()
    assert listed["total"] == 0


def test_an_overlapping_registration_in_progress_is_refused(
    client: TestClient, keys: Keys, make_key: Any, root: Path
) -> None:
    names = parquet(root / "set" / "a.parquet", np.random.default_rng(3).normal(size=(50, 2)))
    assert post(client, keys.owner, str(root / "set"), names).status_code == 202
    for uri in (str(root / "set"), str(root / "set" / "a.parquet"), str(root)):
        again = post(client, make_key("owner"), uri, names)
        assert again.status_code == 409, (uri, again.text)
        assert again.json()["error"] == "object_registered"
        assert "registration still in progress" in again.json()["detail"]


def test_a_registration_whose_worker_died_is_claimed_again_then_abandoned(
    client: TestClient,
    keys: Keys,
    root: Path,
    settings: Settings,
    store: DatasetStore,
    session_factory: sessionmaker[Session],
) -> None:
    """The lease as for a release: a claim whose worker stopped heartbeating is claimable once
    it expires (another worker finishes it); past DPSS_WORKER_MAX_ATTEMPTS claims it fails."""
    names = parquet(root / "set" / "a.parquet", np.random.default_rng(4).normal(size=(50, 2)))
    first = post(client, keys.owner, str(root / "set"), names).json()["id"]
    dead = Worker(session_factory, store, settings, worker_id="dead")
    job = registration.claim(dead)
    assert job is not None and job.attempt == 1
    other = Worker(session_factory, store, settings, worker_id="other")
    assert registration.claim(other) is None  # leased
    with session_factory.begin() as session:
        row = session.get(Dataset, uuid.UUID(first))
        assert row is not None
        row.registration_lease_expires_at = utcnow() - timedelta(seconds=1)
    assert other.run_registration()
    assert show(client, keys.owner, first)["registration_status"] == "ready"
    # The dead worker's late finish is discarded.
    assert registration.process(dead, job) == "lost"
    # Abandoned after the attempts allowed.
    parquet(root / "b.parquet", np.random.default_rng(5).normal(size=(50, 2)))
    second = post(client, keys.owner, str(root / "b.parquet"), names).json()["id"]
    with session_factory.begin() as session:
        row = session.get(Dataset, uuid.UUID(second))
        assert row is not None
        row.registration_attempts = settings.worker_max_attempts
    assert registration.claim(other) is None
    failed = show(client, keys.owner, second)
    assert failed["registration_status"] == "failed"
    assert "abandoned after" in failed["registration_reason"]


def test_a_dataset_deleted_while_registering_stays_deleted(
    client: TestClient,
    keys: Keys,
    root: Path,
    worker: Worker,
    session_factory: sessionmaker[Session],
) -> None:
    names = parquet(root / "set" / "a.parquet", np.random.default_rng(6).normal(size=(50, 2)))
    dataset_id = post(client, keys.owner, str(root / "set"), names).json()["id"]
    job = registration.claim(worker)
    assert job is not None
    deleted = client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner))
    assert deleted.status_code == 204
    assert registration.process(worker, job) == "lost"
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == 0


def test_the_client_waits_and_the_cli_reports_a_failure(
    client: TestClient, keys: Keys, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = np.random.default_rng(7).normal(size=(100, 2)) / 4
    parquet(root / "set" / "a.parquet", rows)
    monkeypatch.setattr(handles_module, "_sleep", lambda _: helpers.run_registrations(client))
    owner = Client(str(client.base_url), keys.owner, http=client)
    common: dict[str, Any] = {"name": "lake", "epsilon_budget": "1", "delta_budget": "1e-5"}
    pending = owner.register_reference(str(root / "set"), ["c0", "c1"], wait=False, **common)
    assert pending.registration_status == "registering"
    assert owner.wait_registered(pending.id).n_rows == 100
    parquet(root / "c.parquet", rows)
    with pytest.raises(RegistrationFailed, match="columns: 'zz' is not a column"):
        owner.register_reference(str(root / "c.parquet"), ["c0", "zz"], **common)

    # The CLI waits by default and exits FAILED with the reason.
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    parquet(root / "b.parquet", rows / 2)  # not a copy of a registered object
    env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": keys.owner, "COLUMNS": "200"}
    result = CliRunner().invoke(
        make_app(),
        ["datasets", "register", str(root / "b.parquet"), "--columns", "c0,c9", "--name", "b",
         "--epsilon-budget", "1", "--delta-budget", "1e-5"],
        env=env,
    )  # fmt: skip
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "'c9' is not a column" in result.output
    ok = CliRunner().invoke(
        make_app(),
        ["datasets", "register", str(root / "b.parquet"), "--columns", "c0,c1", "--name", "b",
         "--epsilon-budget", "1", "--delta-budget", "1e-5", "--json"],
        env=env,
    )  # fmt: skip
    assert ok.exit_code == ExitCode.OK, ok.output
    assert '"registration_status": "ready"' in ok.stdout
