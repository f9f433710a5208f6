"""A scikit-learn-shaped PCA estimator whose ``fit`` asks the service for a private release.

Client side only: it needs the Python client (:mod:`dpss_client.client`), numpy and pydantic, and
never the server. It follows scikit-learn's estimator conventions (the constructor stores its
arguments, ``get_params`` / ``set_params``, fitted attributes with a trailing underscore) without
depending on scikit-learn.

>>> from dpss_client import Client, PrivatePCA
>>> with Client("http://127.0.0.1:8000", api_key) as dpss:              # doctest: +SKIP
...     pca = PrivatePCA(dpss, dataset_id, n_components=2, epsilon="0.5", delta="1e-6",
...                      center="private").fit()
...     z = pca.transform(my_public_rows)
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any, Final, Literal
from uuid import UUID, uuid4

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dpss_client import client as client_module
from dpss_client.client import (
    AuthError,
    Client,
    DpssError,
    InvalidRequestError,
    NotFoundError,
    Number,
    ReleaseHandle,
    ServiceUnreachableError,
    WaitTimeoutError,
    feature_names,
    is_sparse,
)
from dpss_client.pca_inputs import _plain, _public_center, _rows, _sparse_rows
from dpss_client.spelling import PRIVATE_PCA

#: An explained-variance interval at least this wide means the noise hides the share. The
#: service decides it and says so in ``explained_variance_hidden_by_noise``, which is what this
#: estimator reads; the width is applied here only to releases made before that flag existed.
#: The service's value (``service.mechanisms.explained_variance.HIDDEN_WIDTH``), derived from
#: the accuracy a stated point promises: mean absolute error at most 0.05 for a point whose 90%
#: box interval (each sum within ``z = ndtri(0.98)`` noise sds) is ``w`` wide, sd at most
#: ``w/(2z)``, so ``w <= 0.05 * 2z / sqrt(2/pi)``, about 0.2574 (it was a round 0.3).
HIDDEN_WIDTH: Final = 0.05 * 2.0 * 2.053748910631823 / math.sqrt(2.0 / math.pi)

__all__ = ["NotFittedError", "PrivatePCA"]

FloatArray = NDArray[np.float64]
#: The mechanism whose released eigenvalues are of the rows' spatial signs, not of the rows.
SIGNS = "spatial_sign"

CenterArg = Literal["none", "private"] | Sequence[float] | FloatArray

#: The constructor's named arguments, in order; any other keyword is a mechanism param.
_NAMED: Final = (
    "client",
    "dataset_id",
    "n_components",
    "epsilon",
    "delta",
    "mechanism",
    "center",
    "center_share",
    "timeout",
    "mu",
    "rho",
    "prior",
)


class NotFittedError(ValueError, AttributeError):
    """A fitted attribute or ``transform`` was used before :meth:`PrivatePCA.fit` (the same
    bases as scikit-learn's ``NotFittedError``, so ``except AttributeError`` code keeps working)."""


class _Request(BaseModel):
    """The checked shape of a fit request (raised as ``ValueError`` naming the field)."""

    model_config = ConfigDict(strict=True, arbitrary_types_allowed=True)

    n_components: int = Field(ge=1)
    mechanism: str = Field(min_length=1)
    center_share: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)


def debias_eigenvalues(noisy: FloatArray, noise_std: float, dim: int) -> FloatArray:
    """Undo the upward shift of the top eigenvalues of ``H + E(noise_std)`` (post-processing).

    ``E`` is a symmetric ``dim x dim`` Gaussian matrix with entries of std ``noise_std``. For an
    eigenvalue ``lam`` of ``H`` above ``noise_std sqrt(dim)``, the matching eigenvalue of
    ``H + E`` concentrates at ``lam + noise_std^2 dim / lam`` (the spiked Wigner model, Baik, Ben
    Arous & Peche); below that threshold it sticks to the spectrum's edge ``2 noise_std
    sqrt(dim)``. Inverting: ``lam = (v + sqrt(v^2 - edge^2)) / 2`` for ``v`` above the edge, and
    ``0`` (not distinguishable from the noise) otherwise. Without it the released ratios
    overstate what the components explain, and can add up to more than 1.

    Parameters
    ----------
    noisy : ndarray of shape (k,)
        Released noisy eigenvalues.
    noise_std : float
        The per-entry noise std of the release (public; extras ``gram_noise_std``).
    dim : int
        ``d``, the side of the noisy matrix.

    Returns
    -------
    ndarray of shape (k,)
    """
    edge = 2.0 * noise_std * math.sqrt(dim)
    above = noisy > edge
    debiased = np.zeros_like(noisy)
    debiased[above] = (noisy[above] + np.sqrt(noisy[above] ** 2 - edge**2)) / 2.0
    return debiased


def _hint_auto(error: InvalidRequestError, asked: str | None, sent: str) -> InvalidRequestError:
    """A param ``auto`` does not take, refused when the caller named no mechanism: say that
    PrivatePCA sent ``auto`` (its default) and how to set the param. A typo the service
    recognised ("did you mean") is left as it is."""
    detail = error.detail
    if asked is not None or sent != "auto" or not detail.startswith("params."):
        return error
    if "unknown field" not in detail or "did you mean" in detail:
        return error
    hint = (
        ' (PrivatePCA sent mechanism "auto", its default for a centred request, which takes'
        ' only the fields listed; pass mechanism="analyze_gauss" to set this one)'
    )
    field, _, rest = detail.partition(";")
    return InvalidRequestError(error.code, f"{field}{hint};{rest}", error.status)


class PrivatePCA:
    """Principal components of a dataset held by the service, released under ``(epsilon, delta)``
    differential privacy.

    Parameters
    ----------
    client : Client
        A connected :class:`dpss_client.client.Client` with an analyst key.
    dataset_id : UUID or str
        The dataset in the service; the rows never leave it.
    n_components : int
        ``k``, the number of components released.
    epsilon, delta : Decimal, str, int or float, optional
        The privacy cost of ``fit``, charged to the dataset's (or the key's grant's) budget
        (on a ``basic`` dataset the charge; on ``hybrid``, the default, and on ``gaussian`` or
        ``zcdp``: the single release calibrated to, charged its own cost in the dataset's
        currency, so ``epsilon_spent`` may grow by less than ``epsilon``). With ``epsilon``
        and no ``delta`` the service uses ``min(1e-6, delta_total / 100)`` of the dataset, and
        under a grant at most the grant's delta / 100 (recorded with the release), so
        ``PrivatePCA(client, dataset_id, n_components=10, epsilon=1)`` is a complete call.
    mu, rho : Decimal, str, int or float, optional
        The cost in the dataset's currency instead: ``mu`` on a ``gaussian`` or ``hybrid``
        dataset, ``rho`` (with ``delta`` for mechanisms with approximate steps) on a ``zcdp``
        or ``hybrid`` one.
    mechanism : str or None
        A mechanism releasing a basis. ``None`` (the default) is the service's best known PCA
        release: ``"auto"`` when the rows are centred (``center`` private or public), which
        runs ``analyze_gauss`` with the settings below or, in high dimension (``n_features >=
        n_rows^(2/3)``, and at a budget where the private centre's error stays below the
        noise), ``spatial_sign`` (each centred row scaled to the norm bound: 1.8x the centred
        variance ``analyze_gauss`` keeps on MNIST at epsilon 1), both with the
        explained-variance figures below; ``"analyze_gauss"`` with ``center="none"`` (auto's
        uncentred choice may be an aggregator, which releases no explained variance). Before
        29 Nov 2026 the default was ``"analyze_gauss"`` in every case. Mechanism params such as
        ``clip_quantile`` belong to a named mechanism (``auto`` refuses them: pass
        ``mechanism="analyze_gauss"`` with them).
    center : "private", "none" or array-like of shape (d,)
        PCA centring. ``"private"`` (the default) gets the service's best known settings without
        further params (where ``auto`` runs ``spatial_sign``, the signs are taken about a private
        mean, ``mean_``); ``analyze_gauss`` clips the rows at a private quantile of their norms
        (``clip_quantile``, 0.3 unless given; recorded in the release's params, or under ``auto`` in
        its extras ``auto_params``) and chooses the centring route from a private probe, all within
        ``(epsilon, delta)``: a private mean (``mean_`` is that released mean), differences of
        paired rows or no centring (extras ``centring``; no mean is released and ``mean_`` is
        zeros). Pass ``clip_quantile="none"`` with ``mechanism="analyze_gauss"`` to opt out (clip at
        the bound, always the private mean). ``"none"``: no centring (components of the
        second-moment matrix; ``mean_`` is zeros). An array: a public centre chosen without looking
        at the data (costs nothing; ``mean_`` is it).
    center_share : float in (0, 1) or None
        The share of ``(epsilon, delta)`` spent on the private mean; ``None`` leaves the
        service's default. Sent only with ``center="private"``.
    timeout : float or None
        Seconds ``fit`` waits for the release to finish (``None``: no limit).
    prior : array-like of shape (n_features, m), UUID, str or None
        A public prior: a basis with orthonormal columns (``m >= n_components``) from public
        data or a fixed transform such as a DCT, never from the dataset's rows. The rows are
        projected onto it and the components are estimated inside its span, with noise in
        ``m`` dimensions instead of ``n_features`` (the cost is the same; the prior costs
        nothing). An array is uploaded once (``POST /v1/priors``) at the first ``fit`` and
        named by id; a UUID or string names a stored prior. Its digest is recorded with the
        release. The explained-variance figures are then those of the rows projected onto
        the prior's span.
    **params
        Further mechanism params sent as they are (e.g. ``clip_norm``); they are parameters of
        the estimator too (``get_params`` lists them, ``set_params`` changes them).

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        The released orthonormal directions, one per row (scikit-learn's layout).
    mean_ : ndarray of shape (n_features,)
        The released private centre, the public centre, or zeros.
    explained_variance_ : ndarray of shape (n_components,) or None
        The (centred; uncentred with ``center="none"``) sum of squares each released
        component captures, divided by ``n - 1``, ``n`` the rows the release read (its
        ``n_rows_read``: those present when it was requested, not rows appended later).
        With ``analyze_gauss`` and a centred ``spatial_sign`` (and ``auto`` when it runs
        either): a fresh private estimate made after the components were chosen (unbiased for
        what they capture, the private mean's known bias removed; the noisy eigenvalues are
        not: the top ones are inflated by the noise they were selected on), shared among the
        components by their debiased eigenvalues; never negative; all NaN where the noise
        hides the share.
        Other mechanisms that release eigenvalues: the eigenvalues with the noise's upward
        shift undone (:func:`debias_eigenvalues`); None for an uncentred ``spatial_sign``
        (its eigenvalues are the spatial signs', every row scaled to the clip norm).
    explained_variance_ratio_ : ndarray of shape (n_components,) or None
        The share of the total variance of the rows clipped to the clip norm that each
        component captures: each in ``[0, 1]``, summing to at most 1. Centred variance with a
        centre (the default ``center="private"``, or a public one); with ``center="none"``
        the rows' uncentred sum of squares, as the components are the second-moment
        matrix's. All NaN where the noise hides the share
        (``explained_variance_hidden_by_noise_``): no figure that would read as a measurement.
    explained_variance_ratio_interval_ : (float, float) or None
        A 90% interval for the total captured share ``sum(explained_variance_ratio_)``, from
        the release's public noise scales (``analyze_gauss``, centred ``spatial_sign``; None
        otherwise).
    explained_variance_split_hidden_by_noise_ : bool or None
        True when the components span the whole space (``n_components = n_features``) and
        fewer of them stand out of the noise than were released (the release's
        ``components_above_noise``): the total share is then exactly 1 (the interval is
        ``(1.0, 1.0)``), but how it splits among the components is not measured (the service
        shares it by debiased eigenvalues, which give every component below the noise's edge
        0 and the others its share: e.g. ``[1, 0, 0, 0, 0]`` on isotropic rows), so
        ``explained_variance_ratio_`` and ``explained_variance_`` are all NaN and a
        ``UserWarning`` says so. False when every component stands out (the split is then
        stated) or ``n_components < n_features``; None without a ratio.
    explained_variance_hidden_by_noise_ : bool or None
        True when the width the service decides on is at least about 0.257 (``HIDDEN_WIDTH``:
        a stated point's mean absolute error would exceed 0.05; the service's flag, read from
        the release): since 30 Nov 2026 that width comes from an independent split of the
        noisy total (``explained_variance_decision_width`` in the extras), so it can differ a
        little from the interval's; releases without the flag fall back to the interval's
        width, cut at 0 or 1 or not. The noise then hides how much the components
        keep, so the service states no point estimate (``null``, and no sums of squares
        whose ratios would read as one) and
        ``explained_variance_ratio_`` and ``explained_variance_`` are all NaN (``warning_``
        says so too; the interval is the measurement); False when it is narrower; None
        without an interval.
    warning_ : str or None
        The release's own warning, e.g. when some components do not stand above the noise
        (computed from public noise scales and released values only; every mechanism that
        releases a basis carries it then, with ``components_above_noise`` and
        ``warning_code`` in the release's extras).
    n_components_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features,) of str
        The string column names of the rows given to :meth:`transform` (any table with a
        ``columns`` attribute, e.g. a pandas DataFrame; scikit-learn's attribute). The service
        keeps no column names, so the first ``transform`` of a table after ``fit`` records
        them, and every later one must have the same names in the same order (``ValueError``
        otherwise, as scikit-learn checks them against ``fit``'s; a warning for rows without
        names). Absent until a table with string names is transformed.
    release_id_ : UUID
        The service's release (its audit trail and cost).
    """

    def __init__(
        self,
        client: Client,
        dataset_id: UUID | str,
        n_components: int,
        epsilon: Number | None = None,
        delta: Number | None = None,
        mechanism: str | None = None,
        center: CenterArg = "private",
        center_share: float | None = None,
        timeout: float | None = None,
        mu: Number | None = None,
        rho: Number | None = None,
        prior: ArrayLike | UUID | str | None = None,
        **params: Any,
    ) -> None:
        # scikit-learn's convention: store the arguments untouched, validate in fit.
        self.mu = mu
        self.rho = rho
        #: None in an unpickled estimator (pickle leaves the client and its key out).
        self.client: Client | None = client
        self.dataset_id = dataset_id
        self.n_components = n_components
        self.epsilon = epsilon
        self.delta = delta
        self.mechanism = mechanism
        self.center = center
        self.center_share = center_share
        self.timeout = timeout
        self.prior = prior
        self._params: dict[str, Any] = dict(params)
        #: ``(prior array's SHA-256, its id in the service)``: an array is uploaded once.
        self._uploaded_prior: tuple[str, str] | None = None
        #: ``(request, release id)`` of a release whose wait timed out or lost the service:
        #: paid for and still running, so the next ``fit`` of the same request waits for it
        #: instead of paying again.
        self._pending: tuple[str, UUID] | None = None
        #: ``(request, Idempotency-Key)`` of a request that got no answer (the service
        #: unreachable or too slow): it may have been charged, so the same request is sent
        #: again with the same key (the same release, charged once).
        self._unanswered: tuple[str, str] | None = None

    # ----------------------------------------------------------------------------------------
    # scikit-learn's parameter protocol

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments (mechanism params included): ``PrivatePCA(**p)``
        rebuilds an unfitted copy. ``deep`` is accepted for compatibility; no parameter is
        itself an estimator."""
        named = {name: getattr(self, name) for name in _NAMED}
        return {**named, **self._params}

    def set_params(self, **params: Any) -> PrivatePCA:
        """Change parameters and return ``self``. Names must be constructor arguments or
        mechanism params given at construction; anything else raises ``ValueError`` (build a
        new estimator to add a mechanism param)."""
        unknown = sorted(set(params) - set(_NAMED) - set(self._params))
        if unknown:
            valid = ", ".join([*_NAMED, *sorted(self._params)])
            raise ValueError(
                f"invalid parameter(s) {', '.join(map(repr, unknown))} for PrivatePCA; "
                f"valid parameters are: {valid}"
            )
        for name, value in params.items():
            if name in _NAMED:
                setattr(self, name, value)
            else:
                self._params[name] = value
        return self

    def __sklearn_is_fitted__(self) -> bool:
        """scikit-learn's ``check_is_fitted`` asks this: fitted once ``fit`` succeeded."""
        return hasattr(self, "components_")

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's estimator tags (asked by its tools only, so scikit-learn is imported
        here, never by the client): an unsupervised transformer that must be fitted, whose
        fits differ run to run (the noise is the privacy)."""
        utils = importlib.import_module("sklearn.utils")
        return utils.Tags(
            estimator_type=None,
            target_tags=utils.TargetTags(required=False),
            transformer_tags=utils.TransformerTags(),
            non_deterministic=True,
            requires_fit=True,
        )

    # ----------------------------------------------------------------------------------------
    # Pickling and copies

    def __getstate__(self) -> dict[str, Any]:
        """What ``pickle`` (and ``joblib.dump``) keep: the parameters and the fitted attributes,
        never :attr:`client`, which holds the API key in clear and live connections. A saved
        model carries no key (and pickling does not fail on the connection's locks); an
        unpickled estimator transforms at once, and fits again once given a client:
        ``set_params(client=Client(url, key))``."""
        state = dict(self.__dict__)
        state["client"] = None
        return state

    def __copy__(self) -> PrivatePCA:
        """A shallow copy keeps the client (pickle's state leaves it out)."""
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> PrivatePCA:
        """A deep copy (scikit-learn's ``clone`` of a parameter, ``GridSearchCV``'s copies)
        keeps talking to the service through the same client (``Client.__deepcopy__`` is the
        client itself); everything else is copied."""
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        twin.__dict__.update({name: copy.deepcopy(v, memo) for name, v in self.__dict__.items()})
        return twin

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.get_params().items() if k != "client"}
        return f"PrivatePCA({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    # ----------------------------------------------------------------------------------------
    # Fitting

    def _connected(self) -> Client:
        """:attr:`client`, or ``ValueError`` naming it when there is none (an unpickled
        estimator), before anything is requested."""
        if self.client is None:
            raise ValueError(
                "client: this PrivatePCA has no Client (a pickled estimator does not keep its "
                "API key): set_params(client=Client(url, api_key)) before fit()"
            )
        return self.client

    def _mechanism(self) -> str:
        """:attr:`mechanism`, or for ``None`` the default: ``"auto"`` for a centred request
        (the service's best known PCA release, explained variance included), else
        ``"analyze_gauss"``."""
        if self.mechanism is not None:
            return self.mechanism
        return "analyze_gauss" if isinstance(self.center, str) and self.center == "none" else "auto"

    def _release_params(self) -> dict[str, Any]:
        params = {name: _plain(value) for name, value in self._params.items()}
        center = self.center
        if isinstance(center, str):
            if center not in ("none", "private"):
                raise ValueError(f'center: expected "none", "private" or d numbers, got {center!r}')
            # "none" is the service's default: not sending it keeps fit working on services
            # without centring. spatial_sign's own default is a private centre: "none" is sent
            # to it (else the release paid for a centre nobody asked for, and mean_, zeros,
            # was not the centre its components were taken about).
            if center == "none" and self._mechanism() == SIGNS:
                params["center"] = "none"
            if center == "private":
                params["center"] = "private"
                if self.center_share is not None:
                    params["center_share"] = _plain(self.center_share)
        else:
            params["center"] = _public_center(center).tolist()
        prior_id = self._prior_id()
        if prior_id is not None:
            params["prior_id"] = prior_id
        return params

    def _prior_id(self) -> str | None:
        """The id of :attr:`prior` in the service, uploading an array the first time."""
        prior = self.prior
        if prior is None:
            return None
        if isinstance(prior, UUID | str):
            return str(prior)
        array = np.asarray(prior, dtype=np.float64)
        if array.ndim != 2:
            raise ValueError(f"prior: expected a 2-D (d x m) basis, got shape {array.shape}")
        digest = hashlib.sha256(np.ascontiguousarray(array, dtype="<f8").tobytes()).hexdigest()
        if self._uploaded_prior is None or self._uploaded_prior[0] != digest:
            stored = self._connected().upload_prior(array, name="PrivatePCA prior")
            self._uploaded_prior = (digest, str(stored.id))
        return self._uploaded_prior[1]

    def fit(self, X: None = None, y: None = None) -> PrivatePCA:
        """Request the release from the service, wait for it, and set the fitted attributes.

        ``X`` must be ``None``: the data lives in the service and never reaches the client
        (``X`` and ``y`` are in the signature only for scikit-learn's calling convention).
        Each call spends ``(epsilon, delta)`` again.

        Raises
        ------
        TypeError
            ``X`` or ``y`` given.
        ValueError
            A parameter is out of range, or there is no :attr:`client` (an unpickled
            estimator); nothing is requested then.
        dpss_client.client.ReleaseNoResult, dpss_client.client.ReleaseFailed
            The release ended without a result (the message says why and whether the cost
            was refunded).
        dpss_client.client.WaitTimeoutError
            ``timeout`` seconds passed; the release keeps running in the service, its cost
            charged. Calling ``fit()`` again with the same parameters (``timeout`` aside) waits
            for that release instead of requesting (and paying for) another.
        dpss_client.client.ServiceUnreachableError
            No answer from the service (its subclass ``ServiceTimeoutError``: too slow). The
            release may have been made and charged; ``fit()`` again with the same parameters
            gets that release (the request is sent again with the same ``Idempotency-Key``, or
            the wait resumes) instead of paying for another.
        dpss_client.client.DpssError
            Any other error from the service (budget exceeded, bad params, ...).

        Warns
        -----
        UserWarning
            The noise hides the explained-variance share
            (``explained_variance_hidden_by_noise_``): ``explained_variance_ratio_`` and
            ``explained_variance_`` are NaN, the 90% interval is kept. Or the components span
            the whole space and the noise hides how the (exact) total splits among them
            (``explained_variance_split_hidden_by_noise_``): the same NaN.
        """
        if X is not None or y is not None:
            raise TypeError(
                "PrivatePCA.fit takes no data: the rows live in the service, which releases the "
                "components privately; call fit() and then transform(your_rows)"
            )
        client = self._connected()
        try:
            checked = _Request(
                n_components=_plain(self.n_components),
                mechanism=self._mechanism(),
                center_share=_plain(self.center_share),
                timeout=_plain(self.timeout),
            )
        except ValidationError as error:
            first = error.errors()[0]
            raise ValueError(f"{first['loc'][0]}: {first['msg']}") from None
        params = self._release_params()
        if "k" in params:
            # Not a mechanism parameter: the release's k, which is n_components here (the
            # request failed "Client.release() got multiple values for keyword argument 'k'").
            raise ValueError(
                "k: PrivatePCA's rank is n_components (scikit-learn's name): "
                "PrivatePCA(client, dataset_id, n_components=5, ...)"
            )
        # The request waits for its release itself (one request, not a request and a long
        # poll); what it has not finished within that, wait_finished waits for.
        wait = client_module.LONG_POLL_SECONDS
        if checked.timeout is not None:
            wait = min(wait, checked.timeout)
        started = time.monotonic()
        request = repr(
            (
                str(self.dataset_id),
                checked.mechanism,
                checked.n_components,
                *(str(_plain(v)) for v in (self.epsilon, self.delta, self.mu, self.rho)),
                sorted(params.items()),
            )
        )
        if self._pending is not None and self._pending[0] == request:
            handle = client.get_release(self._pending[1])
        else:
            # A request whose answer never came may have made, and charged, its release: the
            # same fit again sends the same Idempotency-Key, which returns that release
            # (charged once) or makes it if it was never made.
            unanswered = self._unanswered
            key = unanswered[1] if unanswered and unanswered[0] == request else str(uuid4())
            try:
                handle = client.release(
                    self.dataset_id,
                    checked.mechanism,
                    k=checked.n_components,
                    epsilon=self.epsilon,
                    delta=self.delta,
                    mu=self.mu,
                    rho=self.rho,
                    idempotency_key=key,
                    wait=wait,
                    **params,
                )
            except InvalidRequestError as error:
                hinted = _hint_auto(error, self.mechanism, checked.mechanism)
                raise hinted.respelled(PRIVATE_PCA) from None
            except ServiceUnreachableError as error:
                if not error.sent:
                    # No connection was made: no release, no charge, nothing to resume.
                    raise
                self._unanswered = (request, key)
                raise error.noted(
                    "the release may have been made and its cost charged: call fit() again "
                    "with the same parameters to get that release without paying again"
                ) from None
            except DpssError as error:
                # A refusal (budget, grant) names the API's fields and query parameters; say
                # them as this estimator's arguments (dpss_client.spelling).
                raise error.respelled(PRIVATE_PCA) from None
            self._unanswered = None
        left = None
        if checked.timeout is not None:
            left = max(checked.timeout - (time.monotonic() - started), 0.0)
        try:
            handle.wait_finished(timeout=left)
            basis = handle.basis()
            self._set_fitted(handle, basis, params)
        except ServiceUnreachableError as error:
            # Paid for (and perhaps finished: the last read of a fit is the dataset's n): the
            # same fit gets it, as after a wait timeout below. _set_fitted sets nothing before
            # its reads, so no attribute of a half fit is left.
            self._pending = (request, handle.id)
            raise error.noted(
                f"release {handle.id} is paid for: call fit() again with the same parameters "
                "to get it without paying again"
            ) from None
        except WaitTimeoutError as error:
            self._pending = (request, handle.id)
            # The fit's whole wait (the request's own long poll included), not the handle's
            # part of it: "after 44.9 s" from fit(timeout=70) read as a timeout not honoured.
            why = f" ({handle.no_worker})" if handle.no_worker else ""
            raise WaitTimeoutError(
                error.code,
                f"release {handle.id} still {handle.status} after "
                f"{time.monotonic() - started:.1f} s (timeout={checked.timeout}){why}; "
                "it keeps running in the service and its cost is charged: "
                "call fit() again (same parameters, a longer or no timeout) to wait for it "
                "without paying again",
            ) from None
        self._pending = None
        return self

    def _set_fitted(self, handle: ReleaseHandle, basis: FloatArray, params: dict[str, Any]) -> None:
        extras = handle.extras
        d, k = basis.shape
        if "center" not in params or params["center"] == "none":
            mean = np.zeros(d)
        elif params["center"] == "private" and extras.get("centring") in ("pairs", "none"):
            # The release chose a route without a mean (differences of paired rows, or none):
            # it released no centre, so none is subtracted. With pairs the components are those
            # of the centred data and scores are offset by the (unreleased) mean's projection.
            mean = np.zeros(d)
        elif params["center"] == "private":
            if "center" not in extras:
                raise DpssError(
                    "no_center",
                    f"release {handle.id} ({handle.info.mechanism}) returned no private centre",
                )
            mean = np.asarray(extras["center"], dtype=np.float64).reshape(d)
        else:
            mean = np.asarray(params["center"], dtype=np.float64)
            if mean.shape != (d,):
                raise ValueError(f"center: expected {d} numbers, got {mean.shape[0]}")
        variance, ratio, interval = self._explained(
            extras, d, k, handle.info.mechanism, handle.info.n_rows_read
        )
        self.components_: FloatArray = np.ascontiguousarray(basis.T)
        self.mean_: FloatArray = mean
        split_hidden = self._split_hidden(extras, d, k, ratio)
        if split_hidden:
            # k = d: the total share is 1 by a public fact, but a component below the noise's
            # edge gets 0 of it and the others its part, by their noisy eigenvalues: no
            # per-component figure is a measurement, so none is stated (as a hidden share).
            ratio = np.full(k, np.nan)
            variance = None if variance is None else np.full(k, np.nan)
            warnings.warn(
                f"only {extras.get('components_above_noise', 'some')} of the {k} components "
                "stand out of the noise: with n_components = n_features they keep all of the "
                "variance (explained_variance_ratio_interval_ is (1, 1)), but how it splits "
                "among them is not measured, so explained_variance_ratio_ and "
                "explained_variance_ are NaN (more rows or a larger epsilon separate them)",
                UserWarning,
                stacklevel=3,
            )
        self.explained_variance_split_hidden_by_noise_: bool | None = (
            None if ratio is None else split_hidden
        )
        self.explained_variance_: FloatArray | None = variance
        self.explained_variance_ratio_: FloatArray | None = ratio
        self.explained_variance_ratio_interval_: tuple[float, float] | None = interval
        hidden = extras.get("explained_variance_hidden_by_noise")
        if not isinstance(hidden, bool) and interval is not None:
            # Releases made before the flag existed: the same rule from their interval.
            hidden = interval[1] - interval[0] >= HIDDEN_WIDTH
        self.explained_variance_hidden_by_noise_: bool | None = (
            hidden if isinstance(hidden, bool) else None
        )
        if hidden is True and interval is not None:
            warnings.warn(
                "the noise hides how much variance the components keep: the service states "
                "no point estimate, so explained_variance_ratio_ is NaN; the 90% interval "
                f"for their total share is [{interval[0]:.3g}, {interval[1]:.3g}] "
                "(explained_variance_ratio_interval_; more rows or a larger epsilon narrow it)",
                UserWarning,
                stacklevel=3,
            )
        self.warning_: str | None = extras.get("warning")
        self.n_components_: int = k
        self.n_features_in_: int = d
        self.release_id_: UUID = handle.id
        # A new fit starts over: the next table transformed names the features.
        self.__dict__.pop("feature_names_in_", None)

    @staticmethod
    def _split_hidden(extras: dict[str, Any], d: int, k: int, ratio: FloatArray | None) -> bool:
        """Whether the components span the whole space (``k = d``) while fewer than ``k`` of
        them stand out of the noise: the split of the (exact) total among them is then not
        measured. Read from the release's ``explained_variance_split_hidden_by_noise`` (the
        service then states no split: null); a release from before that flag, from its
        ``components_above_noise``, and without that, from its stated split (a component
        below the edge gets exactly 0)."""
        if ratio is None:
            return False
        flag = extras.get("explained_variance_split_hidden_by_noise")
        if isinstance(flag, bool):
            return flag
        if k < d or np.all(np.isnan(ratio)):
            return False
        above = extras.get("components_above_noise")
        if isinstance(above, int) and not isinstance(above, bool):
            return above < k
        return bool(np.any(ratio == 0.0))

    def _explained(
        self,
        extras: dict[str, Any],
        d: int,
        k: int,
        mechanism: str,
        n_rows_read: int | None = None,
    ) -> tuple[FloatArray | None, FloatArray | None, tuple[float, float] | None]:
        """Explained variance, its ratio and the ratio's 90% interval from the release.

        Releases with a fresh explained-variance estimate (``analyze_gauss``, a centred
        ``spatial_sign``, ``auto`` running either) state them; for
        others, the noisy eigenvalues with the noise's shift undone, over the noisy trace,
        capped to ``[0, 1]`` in total (no interval: those figures carry the selection bias).
        An uncentred ``spatial_sign`` (or ``auto`` running it): none (its eigenvalues are the
        signs', every row scaled to the clip norm, not the rows').
        """
        # The rows the release's sums are over: those present at its request (``n_rows_read``),
        # not the dataset's size now, which counts batches appended while it was queued. A
        # service that does not state it: the dataset's size (exact when nothing was appended).
        n_rows = n_rows_read if n_rows_read is not None else self._n_rows()
        scale = None if n_rows is None or n_rows <= 1 else 1.0 / (n_rows - 1)
        if (
            "explained_variance_ratio" not in extras
            and extras.get("auto_choice", mechanism) == SIGNS
        ):
            # An uncentred spatial_sign releases the eigenvalues of the rows' spatial signs
            # (every row scaled to the clip norm), not of the rows: no figure of their variance.
            return None, None, None
        if "explained_variance_ratio" in extras:
            low, high = (float(v) for v in extras["explained_variance_ratio_interval"])
            hidden = extras.get("explained_variance_hidden_by_noise")
            if not isinstance(hidden, bool):
                hidden = high - low >= HIDDEN_WIDTH
            if hidden or extras["explained_variance_ratio"] is None:
                # The noise hides the share: the service states no point (null), so neither
                # does the estimator (NaN, the interval kept; older releases that still carry
                # a figure beside the flag are read the same way).
                missing = np.full(k, np.nan)
                return (None if scale is None else missing), missing.copy(), (low, high)
            sums = np.asarray(extras["explained_sum_of_squares"], dtype=np.float64)
            ratio = np.asarray(extras["explained_variance_ratio"], dtype=np.float64)
            return (None if scale is None else sums * scale), ratio, (low, high)
        eigenvalues = extras.get("eigenvalues")
        if eigenvalues is None:
            return None, None, None
        values = np.asarray(eigenvalues, dtype=np.float64)
        noise_std = extras.get("gram_noise_std")
        if isinstance(noise_std, int | float) and math.isfinite(noise_std):
            values = debias_eigenvalues(values, float(noise_std), d)
        values = np.maximum(values, 0.0)
        shares: FloatArray | None = None
        trace = extras.get("trace")
        if isinstance(trace, int | float) and math.isfinite(trace) and trace > 0:
            shares = values / max(float(trace), float(values.sum()))
        return (None if scale is None else values * scale), shares, None

    def _n_rows(self) -> int | None:
        """``n``, a public fact of the dataset, or None when this key may not read it."""
        try:
            return self._connected().dataset(self.dataset_id).n_rows
        except (AuthError, NotFoundError):
            return None

    def fit_transform(self, X: Any = None, y: Any = None) -> FloatArray:
        """Not possible: the service keeps the rows it fits on, so there is nothing to
        transform. Call ``fit()`` and then ``transform`` on rows you hold."""
        raise TypeError(
            "PrivatePCA cannot fit_transform: the rows it fits on stay in the service; "
            "call fit() and then transform(X) on rows you hold"
        )

    # ----------------------------------------------------------------------------------------
    # Using the fitted components (post-processing: no privacy cost)

    def _check_fitted(self) -> None:
        if not hasattr(self, "components_"):
            raise NotFittedError(
                "this PrivatePCA is not fitted yet: call fit() before using transform, "
                "inverse_transform or the fitted attributes"
            )

    def transform(self, X: ArrayLike) -> FloatArray:
        """Project rows onto the components.

        Parameters
        ----------
        X : array-like or SciPy sparse matrix of shape (m, n_features)
            A sparse matrix is projected without being made dense (as scikit-learn's PCA).

        Returns
        -------
        ndarray of shape (m, n_components)
            ``(X - mean_) @ components_.T``.
        """
        self._check_fitted()
        if is_sparse(X):
            # X @ C^T - mean @ C^T: subtracting the mean first would fill every zero.
            sparse = _sparse_rows(X, self.n_features_in_, "X")
            projected: FloatArray = np.asarray(sparse @ self.components_.T, dtype=np.float64)
            return projected - self.mean_ @ self.components_.T
        names = feature_names(X)
        rows = _rows(X, self.n_features_in_, "X")
        self._check_feature_names(names)
        out: FloatArray = (rows - self.mean_) @ self.components_.T
        return out

    def _check_feature_names(self, names: list[str] | None) -> None:
        """scikit-learn's feature-name check, against the names recorded by the first
        ``transform`` of a table (the service knows no names): the same names in the same
        order, or ``ValueError``; rows without names after that warn, as scikit-learn does."""
        known = getattr(self, "feature_names_in_", None)
        if known is None:
            if names is not None:
                self.feature_names_in_: NDArray[np.object_] = np.asarray(names, dtype=object)
            return
        if names is None:
            warnings.warn(
                "X does not have valid feature names, but PrivatePCA was used with feature "
                f"names {list(known)}: make sure its columns are in that order",
                UserWarning,
                stacklevel=3,
            )
            return
        if list(known) == names:
            return
        message = ["The feature names should match those of the first table transformed:"]
        unseen = [name for name in names if name not in set(known)]
        missing = [name for name in known if name not in set(names)]
        if unseen:
            message.append(f"feature names unseen then: {unseen}")
        if missing:
            message.append(f"feature names seen then, yet now missing: {missing}")
        if not unseen and not missing:
            message.append(
                f"feature names must be in the same order as then: {list(known)}, not {names}"
            )
        raise ValueError("\n".join(message))

    def get_feature_names_out(self, input_features: Any = None) -> NDArray[np.object_]:
        """The output's column names, as scikit-learn names a PCA's: ``privatepca0``,
        ``privatepca1``, ... ``input_features``, when given, is checked as scikit-learn checks
        it (``ValueError`` unless it has ``n_features_in_`` names, equal to
        ``feature_names_in_`` once recorded); it does not change the names."""
        self._check_fitted()
        if input_features is not None:
            given = np.asarray(input_features, dtype=object)
            known = getattr(self, "feature_names_in_", None)
            if known is not None and not np.array_equal(known, given):
                raise ValueError(
                    f"input_features is not equal to feature_names_in_: {list(given)} "
                    f"against {list(known)}"
                )
            if given.ndim != 1 or given.size != self.n_features_in_:
                raise ValueError(
                    "input_features should have length equal to number of features "
                    f"({self.n_features_in_}), got {given.size}"
                )
        return np.asarray([f"privatepca{i}" for i in range(self.n_components_)], dtype=object)

    def inverse_transform(self, X: ArrayLike) -> FloatArray:
        """Map coordinates back to feature space.

        Parameters
        ----------
        X : array-like of shape (m, n_components)

        Returns
        -------
        ndarray of shape (m, n_features)
            ``X @ components_ + mean_``.
        """
        self._check_fitted()
        coords = _rows(X, self.n_components_, "X")
        out: FloatArray = coords @ self.components_ + self.mean_
        return out
