"""A release whose dataset file is missing or incomplete in the data directory (a restore, a lost
volume) ends ``failed`` at once, refunded: the fault does not depend on the data and nothing was
read. Before, the open raised in every attempt until the job was abandoned, charged."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select

import service.datasets
import service.ledger
from service.db.models import Dataset, LedgerEntry, Release
from service.jobs import DATASET_FILE_FAULT_REASON
from service.worker import Worker
from tests.conftest import bearer, post_release
from tests.continual.test_continual_service import grow, start


def _truncate(path: os.PathLike[str]) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.truncate(size - 8)  # one value short of the last row


def _fifo(path: os.PathLike[str]) -> None:
    # A plain open of a FIFO blocks until a writer comes: the check must not open it so.
    os.remove(path)
    os.mkfifo(path)


def _not_npy(path: os.PathLike[str]) -> None:
    with open(path, "r+b") as handle:
        handle.write(b"not a header")


FAULTS = {"missing": os.remove, "truncated": _truncate, "fifo": _fifo, "not-npy": _not_npy}


def _file_of(session_factory, dataset_id: str, store):
    with session_factory() as session:
        dataset = session.execute(
            select(Dataset).where(Dataset.id == uuid.UUID(dataset_id))
        ).scalar_one()
        return store.path_of(dataset.file_name)


def _ledger_kinds(session_factory, release_id: str) -> list[str]:
    with session_factory() as session:
        query = select(LedgerEntry.kind).where(LedgerEntry.release_id == uuid.UUID(release_id))
        return sorted(session.execute(query).scalars())


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_one_shot_release_of_a_lost_file_fails_at_once_refunded(
    client, keys, upload_dataset, rng, session_factory, store, settings, fault, isolate
):
    dataset = upload_dataset(client, keys.owner, rng.normal(size=(50, 4)) * 0.2, row_norm_bound=1.0)
    FAULTS[fault](_file_of(session_factory, dataset["id"], store))
    release_id = post_release(
        client, keys.analyst, dataset["id"], mechanism="analyze_gauss", k=2,
        epsilon="0.25", delta="1e-6",
    )  # fmt: skip
    worker = Worker(session_factory, store, settings, worker_id="w", isolate=isolate)
    assert worker.run_pending() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert (body["status"], body["reason"], body["refunded"]) == (
        "failed",
        DATASET_FILE_FAULT_REASON,
        True,
    )
    with session_factory() as session:
        assert session.get(Release, uuid.UUID(release_id)).attempts == 1
    assert _ledger_kinds(session_factory, release_id) == ["charge", "refund"]
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert budget["epsilon_spent"] == "0"


def test_a_one_shot_release_opens_its_dataset_file_once(
    client, keys, upload_dataset, rng, session_factory, store, settings, monkeypatch
):
    # The run's own open makes the fault checks (presence, header, size) on the file it maps.
    # Before, the worker checked the file first (an open and a header parse) and the run opened
    # and parsed it again, then opened it a third time to map it.
    dataset = upload_dataset(client, keys.owner, rng.normal(size=(50, 4)) * 0.2, row_norm_bound=1.0)
    path = str(_file_of(session_factory, dataset["id"], store))
    post_release(
        client, keys.analyst, dataset["id"], mechanism="analyze_gauss", k=2,
        epsilon="0.25", delta="1e-6",
    )  # fmt: skip
    opened: list[str] = []
    real_open, real_os_open = open, os.open

    def counting_open(file, *args, **kwargs):
        if str(file) == path:
            opened.append("open")
        return real_open(file, *args, **kwargs)

    def counting_os_open(file, *args, **kwargs):
        if str(file) == path:
            opened.append("os.open")
        return real_os_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    monkeypatch.setattr(os, "open", counting_os_open)
    worker = Worker(session_factory, store, settings, worker_id="w", isolate=False)
    assert worker.run_pending() == 1
    assert len(opened) == 1, opened


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_continual_release_of_a_lost_file_fails_at_once(
    client, keys, upload_dataset, rng, session_factory, store, run_worker, fault
):
    """Refunded when no epoch was released; charged once one was (the data was read)."""
    dataset, first = start(client, keys, upload_dataset, rng)
    path = _file_of(session_factory, dataset["id"], store)
    FAULTS[fault](path)
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{first}", headers=bearer(keys.owner)).json()
    assert (body["status"], body["reason"], body["refunded"]) == (
        "failed",
        DATASET_FILE_FAULT_REASON,
        True,
    )
    assert body["epochs_done"] == 0


def test_a_continual_release_that_read_an_epoch_is_not_refunded(
    client, keys, upload_dataset, rng, session_factory, store, run_worker
):
    dataset, release_id = start(client, keys, upload_dataset, rng)
    assert run_worker() == 1  # epoch 1 released
    grow(client, keys, dataset["id"], rng)
    _truncate(_file_of(session_factory, dataset["id"], store))
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert (body["status"], body["reason"]) == ("failed", DATASET_FILE_FAULT_REASON)
    assert body["refunded"] is False and body["epochs_done"] == 1


def test_a_refund_counts_only_once_the_outcome_is_visible(
    client, keys, upload_dataset, rng, session_factory, store, settings, monkeypatch
):
    """Before ``visible_at`` the budget (and a request that only the refund would afford) must
    not tell an analyst that the job ended: the refund takes effect at ``visible_at``."""
    dataset = upload_dataset(
        client, keys.owner, rng.normal(size=(50, 4)) * 0.2, row_norm_bound=1.0,
        epsilon_budget="0.25",
    )  # fmt: skip
    os.remove(_file_of(session_factory, dataset["id"], store))
    body = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.25", "delta": "1e-6"}
    release_id = post_release(client, keys.analyst, dataset["id"], **body)
    budget_path = f"/v1/datasets/{dataset['id']}/budget"
    before = client.get(budget_path, headers=bearer(keys.analyst)).json()
    with session_factory.begin() as session:  # as a padding of an hour would have set it
        hidden = session.get(Release, uuid.UUID(release_id))
        hidden.visible_at = hidden.created_at + timedelta(hours=1)
    Worker(session_factory, store, settings, worker_id="w").run_pending()
    assert _ledger_kinds(session_factory, release_id) == ["charge", "refund"]
    # Within the padding: the same budget, and the whole budget still spent.
    assert client.get(budget_path, headers=bearer(keys.analyst)).json() == before
    assert before["epsilon_remaining"] == "0"
    again = client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=bearer(keys.analyst), json=body
    )
    assert again.status_code == 409
    with session_factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        refund = session.execute(
            select(LedgerEntry).where(
                LedgerEntry.release_id == release.id, LedgerEntry.kind == "refund"
            )
        ).scalar_one()
        assert refund.created_at == release.visible_at
        shown = release.visible_at
    # After visible_at the refund counts.
    later = shown + timedelta(seconds=1)
    monkeypatch.setattr(service.ledger, "utcnow", lambda: later)
    # The one-statement budget read takes its clock from the datasets module.
    monkeypatch.setattr(service.datasets, "utcnow", lambda: later)
    after = client.get(budget_path, headers=bearer(keys.analyst)).json()
    assert after["epsilon_spent"] == "0"
