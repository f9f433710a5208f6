"""PrivatePCA's explained variance divides by the rows its release read (``n_rows_read``), not
by the dataset's size when the fit ends: rows appended while the release waited in the queue
are not in its sums (a one-shot release reads the rows present at its request)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import dpss_client.handles as handles_module
from dpss_client.client import Client
from dpss_client.pca import PrivatePCA
from tests.client.data import low_rank_rows


@pytest.mark.parametrize("center", ["none", "private"])
def test_explained_variance_uses_the_rows_the_release_read(
    owner: Client,
    analyst: Client,
    run_worker: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
    center: str,
) -> None:
    n, d, k = 4_000, 6, 2
    ds = owner.upload(
        low_rank_rows(n, d, k, seed=5),
        name="pca-grows",
        epsilon_budget="2",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    appended: list[int] = []

    def append_then_work(_seconds: float) -> None:
        # The owner appends while the release is queued; then the worker runs it.
        if not appended:
            owner.append_rows(ds.id, low_rank_rows(3 * n, d, k, seed=6))
            appended.append(3 * n)
        run_worker()

    monkeypatch.setattr(handles_module, "LONG_POLL_SECONDS", 0.0)
    monkeypatch.setattr(handles_module, "_sleep", append_then_work)
    pca = PrivatePCA(analyst, ds.id, k, "1", "1e-6", center=center).fit()
    assert appended and owner.dataset(ds.id).n_rows == 4 * n
    release = analyst.get_release(pca.release_id_)
    assert release.info.n_rows_read == n
    assert pca.explained_variance_ is not None
    sums = np.asarray(release.extras["explained_sum_of_squares"])
    np.testing.assert_allclose(pca.explained_variance_, sums / (n - 1))
