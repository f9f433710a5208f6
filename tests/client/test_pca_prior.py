"""PrivatePCA(prior=...): the array uploaded once as a public prior, the release estimated
inside its span, and a stored prior named by id."""

from __future__ import annotations

import numpy as np
import pytest

from dpss_client.client import Client, InvalidRequestError
from dpss_client.pca import PrivatePCA
from tests.client.data import low_rank_rows


@pytest.mark.release_seed(300)
def test_a_prior_array_is_uploaded_once_and_the_fit_lies_in_its_span(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    n, d, k = 4000, 10, 2
    ds = owner.upload(
        low_rank_rows(n, d, k, seed=5),
        name="pca-prior",
        epsilon_budget="2",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    # A public prior: the first four axes, rotated inside themselves (it holds the planted
    # plane, the first two axes).
    rotation, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(4, 4)))
    prior = np.zeros((d, 4))
    prior[:4] = rotation
    pca = PrivatePCA(analyst, ds.id, k, "0.5", "1e-6", prior=prior, timeout=60)
    pca.fit()
    components = pca.components_
    assert components.shape == (k, d)
    # Inside the prior's span: no weight on the six axes it leaves out.
    np.testing.assert_allclose(components[:, 4:], 0.0, atol=1e-10)
    np.testing.assert_allclose(pca.mean_[4:], 0.0, atol=1e-10)
    release = analyst.get_release(pca.release_id_)
    stored = analyst.priors()
    assert len(stored) == 1 and release.info.params["prior_id"] == str(stored[0].id)
    assert release.info.params["prior_sha256"] == stored[0].sha256
    # A second fit reuses the upload; naming the stored prior by id works the same way.
    pca.fit()
    assert len(analyst.priors()) == 1
    by_id = PrivatePCA(analyst, ds.id, k, "0.5", "1e-6", prior=stored[0].id, timeout=60).fit()
    assert np.abs(by_id.components_[:, 4:]).max() < 1e-10
    np.testing.assert_array_equal(np.asarray(analyst.prior(stored[0].id).basis), prior)


def test_a_prior_with_too_few_columns_is_refused(owner: Client, analyst: Client) -> None:
    ds = owner.upload(
        low_rank_rows(200, 6, 2, seed=1),
        name="narrow",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    with pytest.raises(InvalidRequestError, match="prior_id"):
        PrivatePCA(analyst, ds.id, 3, "0.5", "1e-6", prior=np.eye(6, 2)).fit()
