"""PrivatePCA inside scikit-learn's own tools (clone, check_is_fitted) and with NumPy inputs a
data scientist passes without thinking: numpy scalars as parameters, non-finite rows."""

from __future__ import annotations

import copy
import pickle
import warnings
from decimal import Decimal
from typing import Any

import httpx
import numpy as np
import pytest

from dpss_client.client import (
    Client,
    ServiceUnreachableError,
    WaitTimeoutError,
    cost_fields,
    transport_error,
)
from dpss_client.pca import PrivatePCA
from tests.client.data import low_rank_rows

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


# --------------------------------------------------------------------------------------------
# Saving a fitted model: pickle and joblib keep the model, never the client or its key


def test_a_fitted_estimator_pickles_without_its_client_or_key(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    ds = owner.upload(
        low_rank_rows(4_000, 5, 2, seed=3),
        name="pickled",
        epsilon_budget="2",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    pca = PrivatePCA(analyst, ds.id, 2, "0.5", "1e-6", timeout=60).fit()
    rows = low_rank_rows(7, 5, 2, seed=4)
    # Before: TypeError "cannot pickle '_thread.RLock' object" (the client's connection).
    blob = pickle.dumps(pca)
    key = analyst._auth["Authorization"].removeprefix("Bearer ")
    assert key.encode() not in blob and b"Bearer" not in blob
    saved = pickle.loads(blob)
    assert saved.client is None and saved.get_params()["client"] is None
    np.testing.assert_array_equal(saved.transform(rows), pca.transform(rows))
    for name in ("components_", "mean_", "explained_variance_ratio_", "release_id_"):
        np.testing.assert_array_equal(getattr(saved, name), getattr(pca, name))
    # Fitting again needs a client: refused naming it, before anything is charged.
    spent = analyst.budget(ds.id).epsilon_spent
    with pytest.raises(ValueError, match=r"^client: .*set_params\(client="):
        saved.fit()
    assert analyst.budget(ds.id).epsilon_spent == spent
    assert saved.set_params(client=analyst).fit() is saved
    assert analyst.budget(ds.id).epsilon_spent > spent
    # Copies in memory keep the client (clone, GridSearchCV-style deep copies, copy.copy).
    assert copy.copy(pca).client is analyst and copy.deepcopy(pca).client is analyst
    assert sklearn_base.clone(pca).client is analyst


def test_a_client_refuses_pickling_with_a_reason() -> None:
    # Before: TypeError "cannot pickle '_thread.RLock' object", which said nothing of why.
    with pytest.raises(TypeError, match=r"not pickled: it holds an API key"):
        pickle.dumps(_offline())
    client = _offline()
    assert copy.copy(client) is client and copy.deepcopy(client) is client


# --------------------------------------------------------------------------------------------
# Inputs scikit-learn's PCA takes or refuses clearly


def test_transform_takes_sparse_rows_without_densifying_them() -> None:
    sparse = pytest.importorskip("scipy.sparse")
    pca = _fitted()
    pca.components_ = np.linalg.qr(np.random.default_rng(0).normal(size=(4, 2)))[0].T
    pca.mean_ = np.array([0.5, -1.0, 2.0, 0.25])
    dense = np.random.default_rng(1).normal(size=(6, 4)) * (np.arange(24).reshape(6, 4) % 3 == 0)
    # Before: ValueError "setting an array element with a sequence" for every format.
    for matrix in (sparse.csr_matrix, sparse.csc_matrix, sparse.coo_matrix, sparse.csr_array):
        np.testing.assert_allclose(pca.transform(matrix(dense)), pca.transform(dense))
    with pytest.raises(ValueError, match=r"X: expected shape \(m, 4\), got \(6, 3\)"):
        pca.transform(sparse.csr_matrix(dense[:, :3]))
    bad = sparse.csr_matrix(dense)
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match=r"X: contains NaN or infinity"):
        pca.transform(bad)
    with pytest.raises(TypeError, match=r"X: sparse input .*toarray"):
        pca.inverse_transform(sparse.csr_matrix(np.ones((2, 2))))
    with pytest.raises(TypeError, match=r"sparse matrix \(6, 4\) is not uploaded.*toarray"):
        _offline().upload(sparse.csr_matrix(dense), name="s", epsilon_budget=1, delta_budget=0)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        # Before: a ComplexWarning and the imaginary parts silently dropped.
        (np.ones((2, 4), dtype=complex), r"X: expected real numbers: complex"),
        # Before: "could not convert string to float", naming no argument.
        ([["a", "b", "c", "d"]], r"X: expected real numbers: could not convert"),
    ],
)
def test_transform_refuses_what_is_not_real_numbers(rows: Any, message: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=message):
            _fitted().transform(rows)


def test_get_feature_names_out_checks_input_features_as_sklearn_does() -> None:
    pca = _fitted()
    names = ["privatepca0", "privatepca1"]
    assert list(pca.get_feature_names_out()) == names
    assert list(pca.get_feature_names_out(["a", "b", "c", "d"])) == names
    # Before: any input_features were accepted, whatever their number.
    with pytest.raises(ValueError, match=r"length equal to number of features \(4\), got 1"):
        pca.get_feature_names_out(["a"])
    pca.feature_names_in_ = np.asarray(["a", "b", "c", "d"], dtype=object)
    with pytest.raises(ValueError, match=r"not equal to feature_names_in_"):
        pca.get_feature_names_out(["a", "b", "d", "c"])


# --------------------------------------------------------------------------------------------
# A fit that lost the service: the same fit again gets the release already paid for


def _lose_answers(monkeypatch: pytest.MonkeyPatch, client: Client, method: str, path: str) -> None:
    """``client``'s requests ``method path`` (``path*`` when it ends with ``/``) reach the
    service, which acts on them, but their answers are lost (a read timeout)."""
    real = client._request

    def request(verb: str, url_path: str, **kwargs: Any) -> httpx.Response:
        hit = url_path.startswith(path) if path.endswith("/") else url_path == path
        if verb == method and hit:
            real(verb, url_path, **kwargs)
            raise transport_error(client.url, httpx.ReadTimeout("lost"), 5.0)
        return real(verb, url_path, **kwargs)

    monkeypatch.setattr(client, "_request", request)


@pytest.mark.parametrize("lost", ["request", "wait", "last read"])
def test_a_fit_that_lost_its_answer_is_not_paid_twice(
    owner: Client,
    analyst: Client,
    worker_sleep: None,
    monkeypatch: pytest.MonkeyPatch,
    lost: str,
) -> None:
    ds = owner.upload(
        low_rank_rows(4_000, 5, 2, seed=5),
        name="lost-answer",
        epsilon_budget="1",
        delta_budget="1e-5",
        accounting="basic",
        row_norm_bound=1.0,
    )
    pca = PrivatePCA(analyst, ds.id, 2, "0.25", "1e-6", timeout=0.5)
    with monkeypatch.context() as patch:
        if lost == "request":
            _lose_answers(patch, analyst, "POST", f"/v1/datasets/{ds.id}/releases")
        elif lost == "wait":
            _lose_answers(patch, analyst, "GET", "/v1/releases/")
        else:
            # The dataset's n was read after the release for explained_variance_; the rows
            # the release read come with it now (n_rows_read), so losing that read costs
            # nothing: the fit needs no read of the dataset.
            _lose_answers(patch, analyst, "GET", f"/v1/datasets/{ds.id}")
            assert pca.fit() is pca and pca.explained_variance_ is not None
            assert analyst.budget(ds.id).epsilon_spent == Decimal("0.25")
            return
        # While waiting, the wait's own timeout may come first (WaitTimeoutError): both say it.
        with pytest.raises(
            (ServiceUnreachableError, WaitTimeoutError),
            match=r"fit\(\) again .*without paying again",
        ):
            pca.fit()
    assert analyst.budget(ds.id).epsilon_spent == Decimal("0.25")  # the release was made
    # Before: a second release, 0.5 spent for one fit.
    assert pca.set_params(timeout=60).fit() is pca
    assert [r.id for r in analyst.list_releases(dataset_id=ds.id)] == [pca.release_id_]
    assert analyst.budget(ds.id).epsilon_spent == Decimal("0.25")
    # A fit after that one is a new release, paid for.
    pca.fit()
    assert analyst.budget(ds.id).epsilon_spent == Decimal("0.5")
