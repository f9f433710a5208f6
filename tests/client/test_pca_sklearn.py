"""PrivatePCA inside scikit-learn's own tools (clone, check_is_fitted) and with NumPy inputs a
data scientist passes without thinking: numpy scalars as parameters, non-finite rows."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from dpss_client.client import Client, ServiceUnreachableError, cost_fields
from dpss_client.pca import PrivatePCA

sklearn_base = pytest.importorskip("sklearn.base")
sklearn_validation = pytest.importorskip("sklearn.utils.validation")


def _offline() -> Client:
    # Never answers: a fit that gets past its own checks raises ServiceUnreachableError.
    return Client("http://127.0.0.1:9", "unused")


def _fitted(d: int = 4, k: int = 2) -> PrivatePCA:
    pca = PrivatePCA(_offline(), "ds", k, "1", "1e-6")
    pca.components_ = np.eye(d)[:k]
    pca.mean_ = np.zeros(d)
    pca.n_components_, pca.n_features_in_ = k, d
    return pca


def test_sklearn_clone_gives_an_unfitted_copy_sharing_the_connection() -> None:
    client = _offline()
    pca = PrivatePCA(client, "ds", 3, "0.5", center=[0.0, 1.0], clip_norm=2.0)
    twin = sklearn_base.clone(pca)
    assert twin is not pca and isinstance(twin, PrivatePCA)
    assert twin.client is client  # one connection, not a copy of its sockets and locks
    assert twin.get_params() == pca.get_params()
    # A fitted estimator deep-copies too (what GridSearchCV and friends do).
    fitted = _fitted()
    fitted.client = client
    copied = copy.deepcopy(fitted)
    assert copied.client is client
    np.testing.assert_array_equal(copied.components_, fitted.components_)


def test_sklearn_check_is_fitted_sees_fit_state() -> None:
    with pytest.raises(pytest.importorskip("sklearn.exceptions").NotFittedError):
        sklearn_validation.check_is_fitted(PrivatePCA(_offline(), "ds", 2, "1"))
    sklearn_validation.check_is_fitted(_fitted())


@pytest.mark.parametrize(
    "change",
    [
        {"n_components": np.int64(2)},
        {"epsilon": np.float64(0.5)},
        {"center_share": np.float32(0.25)},
        {"timeout": np.int32(30)},
        {"clip_quantile": np.float32(0.3), "mechanism": "analyze_gauss"},
    ],
)
def test_numpy_scalars_pass_the_checks(change: dict[str, Any]) -> None:
    pca = PrivatePCA(_offline(), "ds", 2, "1", "1e-6", center="private", clip_quantile=None)
    pca.set_params(**change)
    with pytest.raises(ServiceUnreachableError):
        pca.fit()


def test_numpy_floats_are_sent_as_their_shortest_decimal() -> None:
    assert cost_fields(epsilon=np.float64(0.1), delta=np.float32(1e-6)) == {
        "epsilon": "0.1",
        "delta": "0.000001",
    }


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_transform_refuses_non_finite_rows(bad: float) -> None:
    pca = _fitted()
    rows = np.zeros((3, 4))
    rows[1, 2] = bad
    with pytest.raises(ValueError, match=r"X: .*(NaN|infinit)"):
        pca.transform(rows)
    with pytest.raises(ValueError, match=r"X: .*(NaN|infinit)"):
        pca.inverse_transform(np.full((1, 2), bad))
