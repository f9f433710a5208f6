"""The client's side of growing datasets: ``append_rows``, ``handle.epochs()`` and
``dpss datasets append``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import dpss_client.handles as handles_module
from dpss_client.client import Client, InvalidRequestError, WaitTimeoutError
from tests.client.test_remote_cli import Dpss, _json, _upload, dpss  # noqa: F401

D = 4


def _grow(owner: Client, rng: np.random.Generator, batches: int) -> str:
    ds = owner.upload(
        rng.normal(size=(30, D)), name="s", epsilon_budget="1", delta_budget="1e-5",
        row_norm_bound=2.0,
    )  # fmt: skip
    for _ in range(batches):
        owner.append_rows(ds.id, rng.normal(size=(20, D)))
    return str(ds.id)


def test_append_rows_from_an_array_and_a_file(owner: Client, rng, tmp_path: Path) -> None:
    dataset_id = _grow(owner, rng, 1)
    path = tmp_path / "more.csv"
    np.savetxt(path, rng.normal(size=(7, D)), delimiter=",")
    batch = owner.append_rows(dataset_id, path)
    assert (batch.seq, batch.n_rows, batch.n_rows_total, batch.n_batches) == (2, 7, 57, 3)
    assert owner.dataset(dataset_id).n_batches == 3
    with pytest.raises(InvalidRequestError, match="columns"):
        owner.append_rows(dataset_id, rng.normal(size=(5, D + 1)))


def test_epochs_yields_each_basis_as_it_is_released(
    owner: Client, analyst: Client, rng, monkeypatch, run_worker
) -> None:
    dataset_id = _grow(owner, rng, 1)
    handle = analyst.release(
        dataset_id, "continual_gauss", k=2, epsilon="0.5", delta="1e-6", horizon=4
    )
    pending = [rng.normal(size=(20, D)) for _ in range(2)]

    def sleep(_seconds: float) -> None:
        # Where the client would wait: the worker runs, and now and then a batch arrives.
        if run_worker() == 0 and pending:
            owner.append_rows(dataset_id, pending.pop())

    monkeypatch.setattr(handles_module, "_sleep", sleep)
    bases = list(handle.epochs(timeout=60, poll_interval=0.01, long_poll=0))
    assert len(bases) == 4
    for basis in bases:
        assert basis.shape == (D, 2)
        np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-9)
    assert handle.status == "succeeded"
    np.testing.assert_array_equal(handle.basis(), bases[-1])


def test_epochs_times_out_when_no_batch_arrives(
    owner: Client, analyst: Client, rng, monkeypatch, run_worker
) -> None:
    dataset_id = _grow(owner, rng, 0)
    handle = analyst.release(
        dataset_id, "continual_gauss", k=1, epsilon="0.5", delta="1e-6", horizon=3
    )
    # The client's clock advances only when it sleeps (and the worker runs then), so the
    # timeout counts the client's pauses, never how long a loaded machine takes to answer.
    clock = SimpleNamespace(now=0.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds
        run_worker()

    fake_time = SimpleNamespace(monotonic=lambda: clock.now)
    monkeypatch.setattr(handles_module, "time", fake_time)
    monkeypatch.setattr(handles_module, "_sleep", sleep)
    seen = []
    with pytest.raises(WaitTimeoutError, match="no new epoch"):
        for basis in handle.epochs(timeout=0.3, poll_interval=0.01, long_poll=0):
            seen.append(basis)
    assert len(seen) == 1


def test_cli_datasets_append(dpss: Dpss, make_key, tmp_path: Path, rng) -> None:  # noqa: F811
    owner = make_key("owner")
    first = tmp_path / "first.npy"
    np.save(first, rng.normal(size=(10, D)))
    ds = _upload(dpss, owner, first)
    more = tmp_path / "more.csv"
    np.savetxt(more, rng.normal(size=(6, D)), delimiter=",")
    result = dpss("datasets", "append", ds["id"], str(more), "--json", key=owner)
    assert result.exit_code == 0, result.output
    assert (_json(result)["seq"], _json(result)["n_rows_total"]) == (1, 16)
    human = dpss("datasets", "append", ds["id"], str(more), key=owner)
    assert human.exit_code == 0 and "batch appended" in human.stdout
    wrong = tmp_path / "wrong.csv"
    np.savetxt(wrong, rng.normal(size=(6, D + 2)), delimiter=",")
    refused = dpss("datasets", "append", ds["id"], str(wrong), key=owner)
    assert refused.exit_code != 0 and "columns" in refused.output
