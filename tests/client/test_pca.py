"""PrivatePCA: scikit-learn's estimator conventions, and fits against the real ASGI app."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

import dpss_client.handles as handles_module
from dpss_client.client import (
    BudgetExceededError,
    Client,
    InvalidRequestError,
    ReleaseNoResult,
    WaitTimeoutError,
)
from dpss_client.pca import HIDDEN_WIDTH, NotFittedError, PrivatePCA, debias_eigenvalues
from tests.client.conftest import Refusable
from tests.client.data import isotropic_rows, low_rank_rows


def _offline() -> Client:
    # Never contacted: these tests do not fit.
    return Client("http://127.0.0.1:9", "unused")


def _fitted(components: np.ndarray[Any, Any], mean: np.ndarray[Any, Any]) -> PrivatePCA:
    """An estimator with fitted attributes set by hand, for the pure post-processing tests."""
    pca = PrivatePCA(_offline(), "ds", components.shape[0], "1", "1e-6")
    pca.components_ = components
    pca.mean_ = mean
    pca.n_components_, pca.n_features_in_ = components.shape
    return pca


def sin_theta(components: np.ndarray[Any, Any], planted: np.ndarray[Any, Any]) -> float:
    """``||(I - P) V||_2`` for orthonormal rows ``components`` (k x d) and ``planted`` (d x k):
    the sine of the largest principal angle between the two subspaces."""
    residual = planted - components.T @ (components @ planted)
    return float(np.linalg.norm(residual, 2))


# --------------------------------------------------------------------------------------------
# Conventions (no service needed)


def test_get_params_round_trip_and_clone_like_rebuild() -> None:
    client = _offline()
    pca = PrivatePCA(
        client, "ds-1", 3, "0.5", "1e-6", center=[0.1, 0.2], center_share=0.3, clip_norm=2.0
    )
    params = pca.get_params()
    assert params == {
        "client": client,
        "dataset_id": "ds-1",
        "n_components": 3,
        "epsilon": "0.5",
        "delta": "1e-6",
        "mechanism": None,
        "center": [0.1, 0.2],
        "center_share": 0.3,
        "timeout": None,
        "mu": None,
        "rho": None,
        "prior": None,
        "clip_norm": 2.0,
    }
    assert pca.get_params(deep=False) == params
    clone = PrivatePCA(**params)
    assert clone is not pca and clone.get_params() == params
    assert not hasattr(clone, "components_")
    assert "client" not in repr(pca) and "clip_norm=2.0" in repr(pca)


def test_set_params_returns_self_and_rejects_unknown_names() -> None:
    pca = PrivatePCA(_offline(), "ds-1", 2, "1", "1e-6", clip_norm=1.0)
    assert pca.set_params(n_components=4, center="none", clip_norm=3.0) is pca
    assert pca.get_params()["n_components"] == 4
    assert pca.center == "none" and pca.get_params()["clip_norm"] == 3.0
    with pytest.raises(ValueError, match=r"'n_component'.*valid parameters are"):
        pca.set_params(n_component=3)
    assert pca.get_params()["n_components"] == 4


def test_transform_inverse_transform_round_trip_on_the_subspace() -> None:
    rng = np.random.default_rng(0)
    d, k = 7, 3
    components = np.linalg.qr(rng.normal(size=(d, k)))[0].T
    mean = rng.normal(size=d)
    pca = _fitted(components, mean)
    coords = rng.normal(size=(50, k))
    rows = coords @ components + mean  # on the affine subspace
    np.testing.assert_allclose(pca.transform(rows), coords, atol=1e-12)
    np.testing.assert_allclose(pca.inverse_transform(pca.transform(rows)), rows, atol=1e-12)
    # Off the subspace, the round trip is the orthogonal projection onto it.
    off = rng.normal(size=(20, d))
    back = pca.inverse_transform(pca.transform(off))
    np.testing.assert_allclose((off - back) @ components.T, 0.0, atol=1e-12)
    with pytest.raises(ValueError, match=r"X: expected shape \(m, 7\)"):
        pca.transform(np.zeros((2, 6)))
    with pytest.raises(ValueError, match=r"X: expected shape \(m, 3\)"):
        pca.inverse_transform(np.zeros(3))


def test_errors_before_fit_and_without_data() -> None:
    pca = PrivatePCA(_offline(), "ds", 2, "1", "1e-6")
    with pytest.raises(NotFittedError, match="call fit"):
        pca.transform(np.zeros((1, 4)))
    with pytest.raises(AttributeError):
        pca.inverse_transform(np.zeros((1, 2)))
    with pytest.raises(TypeError, match="rows live in the service"):
        pca.fit(np.zeros((3, 4)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot fit_transform"):
        pca.fit_transform(np.zeros((3, 4)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_components": 0}, "n_components"),
        ({"center_share": 1.5}, "center_share"),
        ({"center": "mean"}, "center"),
        ({"center": [[0.0, 1.0]]}, "center"),
        ({"timeout": -1.0}, "timeout"),
    ],
)
def test_bad_params_raise_before_any_request(change: dict[str, Any], message: str) -> None:
    # The offline client would raise ServiceUnreachableError if fit reached the network.
    pca = PrivatePCA(_offline(), "ds", 2, "1", "1e-6").set_params(**change)
    with pytest.raises(ValueError, match=message):
        pca.fit()


def test_k_is_named_n_components_before_any_request() -> None:
    # k= went on as a mechanism parameter and the request failed with "Client.release() got
    # multiple values for keyword argument 'k'".
    pca = PrivatePCA(_offline(), "ds", 5, "1", k=5)
    with pytest.raises(ValueError, match=r"^k: PrivatePCA's rank is n_components"):
        pca.fit()


def test_debiasing_undoes_the_noise_shift_of_the_top_eigenvalues() -> None:
    # Spiked Wigner: H = diag(spikes, 0...), E symmetric with N(0, 1) entries, d = 400, so the
    # edge is 2 sqrt(d) = 40 and a spike lam > 20 shows at about lam + d / lam.
    rng = np.random.default_rng(3)
    d, spikes = 400, np.array([200.0, 80.0, 45.0])
    errors_raw, errors_debiased = [], []
    for _ in range(5):
        upper = np.triu(rng.normal(size=(d, d)))
        noisy = np.diag(np.concatenate([spikes, np.zeros(d - 3)])) + upper + np.triu(upper, 1).T
        top = np.linalg.eigvalsh(noisy)[::-1][:4]
        debiased = debias_eigenvalues(top, 1.0, d)
        errors_raw.append(np.abs(top[:3] / spikes - 1))
        errors_debiased.append(np.abs(debiased[:3] / spikes - 1))
        # A pure-noise eigenvalue (near the edge, 40) maps to at most about edge / 2.
        assert debiased[3] < 30
    # Raw: +1% / +6% / +20% (d / lam^2); debiased within a few percent.
    assert np.median(errors_raw, axis=0)[2] > 0.1
    assert np.all(np.median(errors_debiased, axis=0) < 0.05)


def test_debiasing_leaves_values_far_above_the_noise_and_zeroes_those_below() -> None:
    out = debias_eigenvalues(np.array([1e6, 39.0, -5.0]), 1.0, 400)
    assert out[0] == pytest.approx(1e6 - 400 / 1e6, rel=1e-12)
    assert out[1] == 0 and out[2] == 0


# --------------------------------------------------------------------------------------------
# Against the live app


@pytest.mark.release_seed(100)
def test_fit_uncentred_against_a_live_release(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    n, d, k = 20_000, 6, 2
    ds = owner.upload(
        low_rank_rows(n, d, k, seed=11),
        name="pca-none",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    pca = PrivatePCA(analyst, ds.id, k, "1", "1e-6", center="none", timeout=60).fit()
    assert pca.components_.shape == (k, d) and (pca.n_components_, pca.n_features_in_) == (k, d)
    np.testing.assert_allclose(pca.components_ @ pca.components_.T, np.eye(k), atol=1e-8)
    # Gram sensitivity sqrt(2) at (1, 1e-6): sigma ~ 6.7, ||E||_2 <~ 2 sigma sqrt(d) ~ 33;
    # the planted eigenvalues are ~ n / 2.3 ~ 8700 against ~ 50 for the others, so
    # Davis-Kahan gives sin(theta) <= 2 ||E|| / gap ~ 0.008; 0.05 leaves room.
    assert sin_theta(pca.components_, np.eye(d)[:, :k]) < 0.05
    np.testing.assert_array_equal(pca.mean_, np.zeros(d))
    release = analyst.get_release(pca.release_id_)
    assert release.status == "succeeded"
    # The fresh explained-variance estimate: per component, never negative, at most 1 in
    # total, with the release's 90% interval around the total (which is ~1 here: the rows lie
    # in the planted subspace).
    assert pca.explained_variance_ is not None and pca.explained_variance_ratio_ is not None
    sums = np.asarray(release.extras["explained_sum_of_squares"])
    np.testing.assert_allclose(pca.explained_variance_, sums / (n - 1))
    np.testing.assert_allclose(
        pca.explained_variance_ratio_, release.extras["explained_variance_ratio"]
    )
    assert np.all(pca.explained_variance_ratio_ >= 0)
    assert 0.9 < pca.explained_variance_ratio_.sum() <= 1.0
    assert pca.explained_variance_ratio_interval_ is not None
    low, high = pca.explained_variance_ratio_interval_
    assert low <= pca.explained_variance_ratio_.sum() <= high <= 1.0
    assert pca.explained_variance_hidden_by_noise_ is (high - low >= HIDDEN_WIDTH)
    assert (
        pca.explained_variance_hidden_by_noise_
        is release.extras["explained_variance_hidden_by_noise"]
    )
    z = pca.transform(np.eye(d))
    assert z.shape == (d, k)
    assert analyst.budget(ds.id).epsilon_remaining == 0


def _offset_rows(n: int, seed: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Rows ``mu + 0.2 (a e_2 + b e_3) + 0.005 noise`` with ``|mu| = 0.6`` along ``e_1``: the
    uncentred top direction is the offset, the centred plane is ``span(e_2, e_3)``."""
    rng = np.random.default_rng(seed)
    d = 6
    mu = np.zeros(d)
    mu[0] = 0.6
    spread = np.zeros((n, d))
    spread[:, 1:3] = 0.2 * rng.normal(size=(n, 2))
    x = mu + spread + 0.005 * rng.normal(size=(n, d))
    return x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)), mu


def _fit_or_skip(pca: PrivatePCA) -> PrivatePCA:
    try:
        return pca.fit()
    except InvalidRequestError as error:
        if "center" in error.detail:
            pytest.skip(f"this service refuses the center param: {error.detail}")
        raise


@pytest.mark.release_seed(200)
@pytest.mark.parametrize("center", ["public", "private"])
def test_fit_centred_recovers_the_planted_plane_despite_a_large_offset(
    owner: Client, analyst: Client, worker_sleep: None, center: str
) -> None:
    n, k = 40_000, 2
    x, mu = _offset_rows(n, seed=21)
    ds = owner.upload(
        x, name="pca-offset", epsilon_budget="2", delta_budget="1e-5", row_norm_bound=1.0
    )
    uncentred = PrivatePCA(analyst, ds.id, k, "1", "1e-6", center="none").fit()
    # Without centring the offset (second moment 0.36 n) takes the first component.
    assert abs(uncentred.components_[0, 0]) > 0.99
    chosen: Any = mu.tolist() if center == "public" else "private"
    pca = _fit_or_skip(PrivatePCA(analyst, ds.id, k, "1", "1e-6", center=chosen))
    # Centred eigenvalues ~ 0.04 n = 1600 against ~ 1 for the rest; sigma <= 8.4 at the
    # Gram step's (0.8, 0.8e-6), ||E||_2 <~ 2 sigma sqrt(6) ~ 41: sin(theta) <= 2 * 41 / 1600
    # ~ 0.05 by Davis-Kahan; 0.15 leaves room.
    assert sin_theta(pca.components_, np.eye(6)[:, 1:3]) < 0.15
    if center == "public":
        np.testing.assert_array_equal(pca.mean_, mu)
    else:
        # The private mean has sensitivity 2/n; its noise is ~ 1e-3 per coordinate here.
        np.testing.assert_allclose(pca.mean_, x.mean(axis=0), atol=0.01)
    assert pca.explained_variance_ is not None
    # Each planted direction has variance 0.04; eigenvalue noise ~ 41 / n ~ 0.001.
    np.testing.assert_allclose(pca.explained_variance_, [0.04, 0.04], rtol=0.1)
    assert pca.explained_variance_ratio_ is not None
    assert 0.9 < pca.explained_variance_ratio_.sum() <= 1.05
    coords = pca.transform(x[:5])
    assert np.linalg.norm(pca.inverse_transform(coords) - x[:5], axis=1).max() < 0.05


def test_fit_raises_on_no_result_and_timeout(
    owner: Client, analyst: Client, worker_sleep: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = owner.upload(
        isotropic_rows(200, 5, seed=31),
        name="pca-isotropic",
        epsilon_budget="2",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    pca = PrivatePCA(analyst, ds.id, 2, "0.5", "1e-6", mechanism="gap_perturbation", center="none")
    with pytest.raises(ReleaseNoResult, match="declined to release"):
        pca.fit()
    assert not hasattr(pca, "components_")
    run_worker = handles_module._sleep
    monkeypatch.setattr(handles_module, "_sleep", lambda _seconds: None)
    with pytest.raises(WaitTimeoutError, match="still queued") as timed_out:
        pca.set_params(mechanism="analyze_gauss", timeout=0.01).fit()
    assert not hasattr(pca, "components_")
    # The timed-out release is paid for and keeps running: the message says how to get it,
    # and fit() again with the same parameters waits for it instead of paying again.
    assert "call fit() again" in str(timed_out.value)
    spent = owner.budget(ds.id).epsilon_spent
    monkeypatch.setattr(handles_module, "_sleep", run_worker)
    pca.set_params(timeout=None).fit()
    assert str(pca.release_id_) in str(timed_out.value)
    assert owner.budget(ds.id).epsilon_spent == spent
    assert pca.components_.shape == (2, 5)


class _StubInfo:
    mechanism = "analyze_gauss"
    n_rows_read = None


class _StubHandle:
    """What ``_set_fitted`` reads of a finished release."""

    def __init__(self, extras: dict[str, Any]) -> None:
        self.extras = extras
        self.id = "00000000-0000-0000-0000-000000000000"
        self.info = _StubInfo()


@pytest.mark.parametrize(
    ("extras", "expected"),
    [
        ({"centring": "pairs"}, [0.0, 0.0, 0.0]),
        ({"centring": "none"}, [0.0, 0.0, 0.0]),
        ({"centring": "mean", "center": [0.5, -0.25, 0.125]}, [0.5, -0.25, 0.125]),
        ({"center": [0.5, -0.25, 0.125]}, [0.5, -0.25, 0.125]),
    ],
)
def test_transform_subtracts_only_the_centre_the_release_used(
    monkeypatch: pytest.MonkeyPatch, extras: dict[str, Any], expected: list[float]
) -> None:
    # A release that chose paired differences or no centring released no mean: the client
    # must subtract none (issue 24, item 2); the mean route's released centre is subtracted.
    pca = PrivatePCA(_offline(), "ds", 1, "1", "1e-6", center="private", clip_quantile=0.5)
    monkeypatch.setattr(pca, "_n_rows", lambda: None)
    basis = np.eye(3)[:, :1]
    pca._set_fitted(_StubHandle(extras), basis, {"center": "private"})  # type: ignore[arg-type]
    np.testing.assert_array_equal(pca.mean_, expected)
    x = np.asarray([[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(pca.transform(x), [[1.0 - expected[0]]])


@pytest.mark.release_seed(300)
def test_the_default_fit_gets_the_best_settings_on_digits(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    # Issue 32, item 1: PrivatePCA(k=10, epsilon=1) with no other settings (center "private"
    # is its default) gets the service's default clip quantile and centring choice, recorded
    # in the release's params, and keeps about half of digits' centred variance (0.54 on
    # average, 0.745 non-private; 0.32 with the same request before the default existed).
    from sklearn.datasets import load_digits

    rows = load_digits().data
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    train = rows[np.random.default_rng(3).permutation(rows.shape[0])[:1347]]
    ds = owner.upload(
        train, name="digits-train", epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )
    pca = PrivatePCA(analyst, ds.id, 10, "1", "1e-6", timeout=60).fit()
    release = analyst.get_release(pca.release_id_)
    # The default mechanism is auto (29 Nov 2026); d = 64 < n^(2/3) = 122, so it runs
    # analyze_gauss with exactly the settings it had as the default.
    assert release.info.mechanism == "auto"
    assert release.extras["auto_choice"] == "analyze_gauss"
    params = release.extras["auto_params"]
    assert params["center"] == "private"
    assert params["clip_quantile"] == 0.3 and params["center_route"] == "auto"
    assert release.extras["centring"] in ("mean", "pairs", "none")
    centred = train - train.mean(axis=0)
    kept = np.sum((centred @ pca.components_.T) ** 2) / np.sum(centred**2)
    assert kept >= 0.45


@pytest.mark.release_seed(300)
def test_the_literal_default_call_needs_no_delta(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    # PrivatePCA(client, id, n_components, epsilon=...) and nothing else: the service fills
    # in delta = min(1e-6, delta_total / 100) and records it with the release.
    n, d, k = 4_000, 6, 2
    ds = owner.upload(
        low_rank_rows(n, d, k, seed=12),
        name="pca-default",
        epsilon_budget="2",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    pca = PrivatePCA(analyst, ds.id, n_components=k, epsilon=1, timeout=60).fit()
    assert pca.components_.shape == (k, d)
    release = analyst.get_release(pca.release_id_)
    assert release.status == "succeeded"
    assert release.info.delta == Decimal("1e-7")


def _spiked_rows(n: int, d: int, seed: int) -> np.ndarray[Any, Any]:
    """Unit rows: a 3-dim spike (sds 3, 2, 1.5 against isotropic noise of sd 1) plus an offset
    along a fourth direction."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(d, 4)))[0]
    x = rng.normal(size=(n, d)) + (rng.normal(size=(n, 3)) * [3, 2, 1.5]) @ basis[:, :3].T
    x += 4.0 * basis[:, 3]
    return np.asarray(x / np.linalg.norm(x, axis=1, keepdims=True))


@pytest.mark.release_seed(400)
def test_the_default_fit_in_high_dimension_runs_spatial_sign_with_explained_variance(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    # 2,000 x 300 (d >= n^(2/3) = 159): the default PrivatePCA (auto, private centre) runs
    # spatial_sign, which now releases analyze_gauss's explained-variance figures too.
    n, d, k = 2_000, 300, 3
    x = _spiked_rows(n, d, seed=41)
    ds = owner.upload(
        x, name="pca-highdim", epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )
    pca = PrivatePCA(analyst, ds.id, k, "1", "1e-6", timeout=120).fit()
    release = analyst.get_release(pca.release_id_)
    assert release.info.mechanism == "auto" and release.extras["auto_choice"] == "spatial_sign"
    np.testing.assert_array_equal(pca.mean_, release.extras["center"])
    assert pca.explained_variance_ is not None and pca.explained_variance_ratio_ is not None
    np.testing.assert_allclose(
        pca.explained_variance_, np.asarray(release.extras["explained_sum_of_squares"]) / (n - 1)
    )
    assert pca.explained_variance_ratio_interval_ is not None
    low, high = pca.explained_variance_ratio_interval_
    centred = x - x.mean(axis=0)
    kept = np.sum((centred @ pca.components_.T) ** 2) / np.sum(centred**2)
    assert low <= pca.explained_variance_ratio_.sum() <= high
    assert low <= kept <= high and pca.explained_variance_hidden_by_noise_ is False


@pytest.mark.release_seed(400)
@pytest.mark.parametrize("mechanism", ["auto", "spatial_sign"])
def test_an_uncentred_spatial_sign_fit_states_no_variance_of_the_rows(
    owner: Client, analyst: Client, worker_sleep: None, mechanism: str
) -> None:
    # center="none" in high dimension: auto runs spatial_sign without a centre (as a request for
    # spatial_sign with center "none" does), which releases
    # the eigenvalues of the rows' spatial signs (every row scaled to the clip norm), not of
    # the rows. Read as the rows' variance they overstated it 40x on rows of norm 0.3 (0.078
    # stated for 0.0019 kept); with no figure of the rows' own, explained_variance_ is None.
    n, d, k = 2_000, 300, 3
    x = 0.3 * _spiked_rows(n, d, seed=41)
    ds = owner.upload(
        x, name="pca-highdim-signs", epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )
    pca = PrivatePCA(
        analyst, ds.id, k, "1", "1e-6", mechanism=mechanism, center="none", timeout=120
    ).fit()
    release = analyst.get_release(pca.release_id_)
    assert release.extras.get("auto_choice", mechanism) == "spatial_sign"
    assert "explained_variance_ratio" not in release.extras
    assert pca.explained_variance_ is None and pca.explained_variance_ratio_ is None


@pytest.mark.release_seed(500)
def test_a_hidden_share_reads_nan_with_a_warning(
    owner: Client, analyst: Client, worker_sleep: None
) -> None:
    # Issue 32 item 4: 200 isotropic unit rows at eps 0.1, the noise hides the share; the
    # service states no point (null), the estimator reads NaN, keeps the interval and warns
    # (before: a figure that read as a measurement beside the flag).
    rows = np.random.default_rng(7).standard_normal((200, 8))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    ds = owner.upload(
        rows, name="pca-hidden", epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )
    pca = PrivatePCA(analyst, ds.id, 2, "0.1", "1e-7", mechanism="analyze_gauss", timeout=60)
    with pytest.warns(UserWarning, match="explained_variance_ratio_ is NaN"):
        pca.fit()
    release = analyst.get_release(pca.release_id_)
    assert release.extras["explained_variance_ratio"] is None
    assert pca.explained_variance_hidden_by_noise_ is True
    assert pca.explained_variance_ratio_ is not None and pca.explained_variance_ratio_.shape == (2,)
    assert np.all(np.isnan(pca.explained_variance_ratio_))
    assert pca.explained_variance_ is not None and np.all(np.isnan(pca.explained_variance_))
    assert pca.explained_variance_ratio_interval_ == tuple(
        release.extras["explained_variance_ratio_interval"]
    )


@pytest.mark.release_seed(500)
@pytest.mark.parametrize("mechanism", ["analyze_gauss", "auto"])
def test_a_whole_space_split_the_noise_hides_reads_nan_with_a_warning(
    owner: Client, analyst: Client, worker_sleep: None, mechanism: str
) -> None:
    # n_components = d on 200 isotropic unit rows at eps 0.3: the total share is 1 (a public
    # fact), but only some components stand out of the noise. Before, the estimator stated
    # the service's split by debiased eigenvalues, [1, 0, 0, 0, 0], as a measurement (a
    # random direction of isotropic rows keeps 1/d of them, never 0).
    d = 5
    rows = np.random.default_rng(7).standard_normal((200, d))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    ds = owner.upload(
        rows, name="pca-whole", epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )
    pca = PrivatePCA(analyst, ds.id, d, "0.3", "1e-7", mechanism=mechanism, timeout=60)
    with pytest.warns(UserWarning, match="how it splits among them is not measured"):
        pca.fit()
    release = analyst.get_release(pca.release_id_)
    assert release.extras["components_above_noise"] < d
    assert release.extras["explained_variance_hidden_by_noise"] is False
    # The service states no split either, and flags it (the estimator reads that flag).
    assert release.extras["explained_variance_split_hidden_by_noise"] is True
    assert release.extras["explained_variance_ratio"] is None
    assert pca.explained_variance_split_hidden_by_noise_ is True
    assert pca.explained_variance_hidden_by_noise_ is False
    assert pca.explained_variance_ratio_interval_ == (1.0, 1.0)
    assert pca.explained_variance_ratio_ is not None and pca.explained_variance_ratio_.shape == (d,)
    assert np.all(np.isnan(pca.explained_variance_ratio_))
    assert pca.explained_variance_ is not None and np.all(np.isnan(pca.explained_variance_))


def test_the_split_is_hidden_only_at_k_equal_to_d_below_the_noise() -> None:
    split = PrivatePCA._split_hidden
    stated = np.array([0.7, 0.3])
    assert split({"components_above_noise": 1}, 2, 2, stated) is True
    assert split({"components_above_noise": 2}, 2, 2, stated) is False
    # k < d: the total is the measurement (its interval), the flag is about k = d only.
    assert split({"components_above_noise": 1}, 3, 2, stated) is False
    # A release from before the field: a component below the edge got exactly 0.
    assert split({}, 2, 2, np.array([1.0, 0.0])) is True
    assert split({}, 2, 2, stated) is False
    # A hidden share is NaN already; the split flag does not repeat it.
    assert split({"components_above_noise": 0}, 2, 2, np.full(2, np.nan)) is False
    # The service's own flag decides where it is stated: its split is then null (NaN here).
    withheld = np.full(2, np.nan)
    assert split({"explained_variance_split_hidden_by_noise": True}, 2, 2, withheld) is True
    flagged = {"components_above_noise": 1, "explained_variance_split_hidden_by_noise": False}
    assert split(flagged, 2, 2, stated) is False


@pytest.mark.release_seed(301)
@pytest.mark.parametrize("accounting", ["basic", "hybrid"])
def test_the_literal_default_call_fits_a_grant_with_a_small_delta(
    owner: Client, analyst: Client, worker_sleep: None, accounting: str
) -> None:
    # Under a grant of delta 1e-9 the dataset's default of 1e-7 overran the grant (basic: 409
    # for any release; hybrid: for those with approximate steps, which its filters B and C
    # charge, and an (epsilon, 1e-7) release recorded under a 1e-9 grant): the service now
    # fills in min(1e-6, delta_total / 100, grant delta / 100) = 1e-11.
    n, d, k = 4_000, 6, 2
    ds = owner.upload(
        low_rank_rows(n, d, k, seed=12),
        name="pca-grant",
        epsilon_budget="2",
        delta_budget="1e-5",
        row_norm_bound=1.0,
        accounting=accounting,
    )
    owner.create_grant(ds.id, "1.5", "1e-9")
    pca = PrivatePCA(analyst, ds.id, n_components=k, epsilon=1, timeout=60).fit()
    assert pca.components_.shape == (k, d)
    release = analyst.get_release(pca.release_id_)
    assert release.status == "succeeded"
    assert release.info.delta == Decimal("1e-11")


def test_a_param_auto_does_not_take_names_the_default_and_the_way_out(
    refusable: Callable[..., Refusable],
) -> None:
    """PrivatePCA's default sends ``auto``, which refuses ``clip_quantile``: the service's
    "params.clip_quantile: unknown field" named a mechanism the caller never chose. The error
    now says that PrivatePCA sent ``auto`` and how to set the param; a typo keeps the
    service's own suggestion, without the hint. Nothing is charged either way."""
    world = refusable(low_rank_rows(500, 6, 2, seed=3), name="pca-auto-params")
    analyst, ds_id = world.analyst, world.dataset_id
    with pytest.raises(InvalidRequestError) as refused:
        PrivatePCA(analyst, ds_id, 2, "0.5", clip_quantile=0.3).fit()
    detail = refused.value.detail
    assert detail.startswith("clip_quantile: unknown field"), detail
    assert 'sent mechanism "auto"' in detail and 'mechanism="analyze_gauss"' in detail
    with pytest.raises(InvalidRequestError) as typo:
        PrivatePCA(analyst, ds_id, 2, "0.5", centre="private").fit()
    assert "did you mean 'center'" in typo.value.detail and "auto" not in typo.value.detail
    with pytest.raises(InvalidRequestError) as named:
        PrivatePCA(analyst, ds_id, 2, "0.5", mechanism="spectrum", bogus=1).fit()
    assert "analyze_gauss" not in named.value.detail.split("valid fields")[0]
    assert analyst.budget(ds_id).epsilon_spent == 0


def test_a_refusal_names_the_estimators_arguments_and_http_keeps_the_fields(
    refusable: Callable[..., Refusable],
) -> None:
    """An audit of the default path: ``PrivatePCA(client, ds, 3)`` without epsilon was told
    'e.g. "epsilon": 0.5', and ``n_components`` too large was told ``k: ...``. The estimator
    now names its own arguments (dpss_client.spelling); the HTTP answer, which the plain
    client passes on, keeps the JSON fields. The error's type and figures are unchanged."""
    world = refusable(low_rank_rows(300, 5, 2, seed=5), name="pca-spelling")
    analyst, ds_id = world.analyst, world.dataset_id
    with pytest.raises(InvalidRequestError) as no_cost:
        PrivatePCA(analyst, ds_id, 2).fit()
    detail = no_cost.value.detail
    assert detail.startswith("epsilon: required: epsilon"), detail
    assert "e.g. epsilon=0.5;" in detail and '"epsilon"' not in detail, detail
    assert str(no_cost.value) == f"invalid_input: {detail}"
    with pytest.raises(InvalidRequestError) as too_wide:
        PrivatePCA(analyst, ds_id, 9, epsilon="0.5").fit()
    assert too_wide.value.detail == "n_components: must be <= the number of columns (5)"
    with pytest.raises(BudgetExceededError) as broke:
        PrivatePCA(analyst, ds_id, 2, epsilon="2").fit()
    assert "`client.preview_release(...)`" in broke.value.detail, broke.value.detail
    assert broke.value.epsilon_remaining is not None and broke.value.status == 409
    # The HTTP answer (the plain client passes it on as sent).
    with pytest.raises(InvalidRequestError) as http:
        analyst.release(ds_id, "auto", 9, "0.5")
    assert http.value.detail == "k: must be <= the number of columns (5)"
    with pytest.raises(InvalidRequestError) as http_cost:
        analyst.release(ds_id, "auto", 2)
    assert 'e.g. "epsilon": 0.5' in http_cost.value.detail
    assert analyst.budget(ds_id).epsilon_spent == 0
