"""Python client for the dp-subspace-service HTTP API.

Runs on an analyst's laptop: it needs httpx, numpy, pydantic, rich and ``api_schemas``, and never
imports the server (no FastAPI, SQLAlchemy or database code).

>>> from dpss_client import Client
>>> with Client("http://127.0.0.1:8000", api_key) as dpss:            # doctest: +SKIP
...     ds = dpss.upload("patients.npy", epsilon_budget="1", delta_budget="1e-5",
...                      row_norm_bound=1.0)
...     basis = dpss.release(ds.id, k=3, epsilon="0.5").wait(progress=True)
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import httpx

from api_schemas.audit import AuditEvent, AuditPage
from api_schemas.datasets import Budget, Dataset, DatasetBatch, DatasetCreated, DatasetList
from api_schemas.grants import Grant, GrantList
from api_schemas.history import ReleasePage
from api_schemas.keys import KeyCreated, KeyInfo, KeyPage, Role
from api_schemas.mechanisms import MechanismInfo, MechanismList
from api_schemas.priors import Prior, PriorList, PriorWithBasis
from api_schemas.releases import Release, ReleasePreview, ReleaseStatus
from dpss_client import handles as _waits
from dpss_client.defaults import DEFAULT_MECHANISM
from dpss_client.defaults import DEFAULT_URL as DEFAULT_URL
from dpss_client.errors import (
    AuthError,
    BudgetExceededError,
    ConflictError,
    DpssError,
    InvalidRequestError,
    NoBasisError,
    NotFoundError,
    RegistrationFailed,
    ReleaseFailed,
    ReleaseNoResult,
    ReleaseOutcomeError,
    ServerError,
    ServiceTimeoutError,
    ServiceUnreachableError,
    WaitTimeoutError,
    error_from_response,
    transport_error,
)
from dpss_client.handles import FINISHED as FINISHED
from dpss_client.handles import LONG_POLL_SECONDS as LONG_POLL_SECONDS
from dpss_client.handles import NO_WORKER_CHECK_SECONDS as NO_WORKER_CHECK_SECONDS
from dpss_client.handles import RECONNECT_SECONDS as RECONNECT_SECONDS
from dpss_client.handles import NoWorkerWarning, ReleaseHandle
from dpss_client.uploads import (
    _CONTENT_TYPES,
    NpyStream,
    UploadProgress,
    _is_path,
    _Reporting,
    as_rows,
    feature_names,
    is_sparse,
)
from dpss_client.wire import (
    _M,
    RELEASE_READ,
    Number,
    _decimal_str,
    _parse,
    _release_filters,
    _unknown_query,
    basis_sha256,
    cost_fields,
)

if TYPE_CHECKING:
    # numpy is imported where a basis or an array is handled: the commands that only list,
    # show or grant (and `dpss --help`) start without it (bench/bench_cli_startup.py).
    from numpy.typing import ArrayLike

# The names callers import from here, wherever they are defined (errors, uploads, wire, handles).
__all__ = [
    "LONG_POLL_SECONDS",
    "AuthError",
    "BudgetExceededError",
    "Client",
    "ConflictError",
    "DpssError",
    "InvalidRequestError",
    "NoBasisError",
    "NoWorkerWarning",
    "NotFoundError",
    "NpyStream",
    "Number",
    "RegistrationFailed",
    "ReleaseFailed",
    "ReleaseHandle",
    "ReleaseNoResult",
    "ReleaseOutcomeError",
    "ServerError",
    "ServiceTimeoutError",
    "ServiceUnreachableError",
    "UploadProgress",
    "WaitTimeoutError",
    "as_rows",
    "basis_sha256",
    "cost_fields",
    "error_from_response",
    "feature_names",
    "is_sparse",
    "transport_error",
]

_Page = TypeVar("_Page", DatasetList, ReleasePage, KeyPage, PriorList)


def _required_k(k: int | None, method: str) -> int:
    """``k``, which has no default: it follows ``mechanism`` (which has one) positionally, so
    that ``release(ds, "analyze_gauss", 3, ...)`` keeps working and ``release(ds, k=3, ...)``
    works too; a call without it fails here, before any request, as a missing argument."""
    if k is None:
        raise TypeError(
            f"{method}() missing required argument 'k' (the released subspace's dimension, "
            "e.g. k=3)"
        )
    return k


#: The hint a refusal of a param the default mechanism does not take gets in Python.
PYTHON_DEFAULT_HINT = (
    f' (no mechanism was given, so "{DEFAULT_MECHANISM}", the default, was sent: it '
    'takes only the fields listed; pass mechanism="analyze_gauss" to set this one)'
)


@contextmanager
def defaulted_mechanism(asked: str | None, hint: str = PYTHON_DEFAULT_HINT) -> Iterator[None]:
    """A param the default mechanism does not take, refused when the call named none: say, with
    the surface's own ``hint``, that ``auto`` was sent and how to set the param (the client's,
    ``dpss releases create``'s and PrivatePCA's). A typo the service recognised ("did you
    mean") is left as it is."""
    try:
        yield
    except InvalidRequestError as error:
        detail = error.detail
        if asked is not None or not detail.startswith("params.") or "unknown field" not in detail:
            raise
        if "did you mean" in detail:
            raise
        field, _, rest = detail.partition(";")
        raise InvalidRequestError(error.code, f"{field}{hint};{rest}", error.status) from None


# --------------------------------------------------------------------------------------------
# The client


class Client:
    """A synchronous client for one service and one API key.

    Parameters
    ----------
    url:
        The service's base URL, e.g. ``http://127.0.0.1:8000``.
    api_key:
        The bearer secret (``dpss keys create`` prints it).
    http:
        An ``httpx.Client`` to send requests with (tests pass a FastAPI ``TestClient``); it is
        not closed by :meth:`close`. By default the client makes and owns one.
    timeout:
        Seconds to wait for each network operation (connect, read, write).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        http: httpx.Client | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        #: Set when the service refused a long poll (a version without them): poll instead.
        self._no_long_poll = False
        #: Set when the service refused ``basis_format`` (a version without it): JSON lists.
        self._no_basis_format = False
        #: Set when the service refused ``wait`` on a release request (a version without it).
        self._no_release_wait = False

    def __deepcopy__(self, memo: dict[int, Any]) -> Client:
        """The same client: a connection (its socket pool, locks and key) is shared, not
        copied. ``copy.deepcopy`` of an object holding it, e.g. scikit-learn's ``clone`` of a
        :class:`~dpss_client.pca.PrivatePCA`, keeps talking to the service through it."""
        return self

    def __copy__(self) -> Client:
        """The same client, as for :meth:`__deepcopy__`."""
        return self

    def __reduce__(self) -> Any:
        """Not picklable, by design and with a reason: a client holds its API key in clear and
        live connections (whose locks ``pickle`` cannot copy anyway). A pickled
        :class:`~dpss_client.pca.PrivatePCA` leaves its client out."""
        raise TypeError(
            "a dpss_client.Client is not pickled: it holds an API key and open connections; "
            "make a new Client(url, api_key) where it is needed"
        )

    def _timeout_plus(self, seconds: float) -> httpx.Timeout:
        """This client's timeouts with ``seconds`` more to read the answer (a long poll)."""
        base = getattr(self._http, "timeout", None)
        if not isinstance(base, httpx.Timeout):
            base = httpx.Timeout(30.0)
        read = None if base.read is None else base.read + seconds
        return httpx.Timeout(base.connect, read=read, write=base.write, pool=base.pool)

    def _long_get(
        self, path: str, model: type[_M], wait: float, params: dict[str, str] | None = None
    ) -> _M | None:
        """``GET path`` as a long poll of ``wait`` seconds; ``None`` when the service refuses
        the ``wait`` parameter (422: a version without long polls), after which this client
        polls instead and never asks it again."""
        try:
            return self._get(
                path,
                model,
                params={**(params or {}), "wait": f"{wait:g}"},
                timeout=self._timeout_plus(wait),
            )
        except InvalidRequestError as exc:
            if exc.status != 422:
                raise
            if params and "basis_format" in params and _unknown_query(exc, "basis_format"):
                self._no_basis_format = True
                rest = {name: value for name, value in params.items() if name != "basis_format"}
                return self._long_get(path, model, wait, rest)
            self._no_long_poll = True
            return None

    def _release_read(self) -> dict[str, str]:
        """The query parameters of a read of a release: :data:`RELEASE_READ` unless the service
        refused it."""
        return {} if self._no_basis_format else dict(RELEASE_READ)

    def _get_release(self, path: str, **kwargs: Any) -> Release:
        """``GET`` a release (``params``, ``timeout`` as for :meth:`_get`) with
        :meth:`_release_read`; asked again without it when the service refuses it (422: a
        version without ``basis_format``)."""
        params = kwargs.pop("params", None) or {}
        try:
            return self._get(path, Release, params={**params, **self._release_read()}, **kwargs)
        except InvalidRequestError as exc:
            if self._no_basis_format or not _unknown_query(exc, "basis_format"):
                raise
            self._no_basis_format = True
            return self._get(path, Release, params=params, **kwargs)

    # Lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Transport ------------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method, self.url + path, headers={**self._auth, **(headers or {})}, **kwargs
            )
        except httpx.TransportError as exc:
            timeout = kwargs.get("timeout", getattr(self._http, "timeout", None))
            raise transport_error(self.url, exc, timeout) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def _get(self, path: str, model: type[_M], **kwargs: Any) -> _M:
        return _parse(self._request("GET", path, **kwargs), model)

    # Datasets -------------------------------------------------------------------------------

    def upload(
        self,
        data: str | os.PathLike[str] | ArrayLike,
        *,
        name: str | None = None,
        epsilon_budget: Number,
        delta_budget: Number,
        row_norm_bound: float | None = None,
        progress: UploadProgress | None = None,
        accounting: str | None = None,
        mu_budget: Number | None = None,
        rho_budget: Number | None = None,
        delta_conversion: Number | None = None,
        allow_large_delta: bool = False,
        privacy_unit_column: str | int | None = None,
        planned_mechanisms: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Dataset:
        """Upload a dataset (owner key) and return its metadata (with ``rows_above_bound``:
        how many of the rows exceed the declared ``row_norm_bound``, shown only here).
        ``allow_large_delta``: accept a ``delta_budget`` above ``1/n`` (refused otherwise: such
        a delta offers no protection). ``privacy_unit_column``: the column naming the person
        each row belongs to (a name, or a 0-based index); it is removed from the features and
        the budget then protects people, not rows (the answer adds ``rows_per_unit``).

        ``data`` is a path to a ``.csv``, ``.npy`` or ``.parquet`` file (streamed from disk; the
        suffix tells the service the format) or any 2-D array-like: a NumPy array (streamed as
        ``.npy`` without a temporary file), nested lists or a DataFrame (``numpy.asarray`` of
        it; a ``privacy_unit_column`` name is then looked up in its string column names).
        ``name`` defaults to the file's stem, or for an array to ``array-NxD`` (its shape).
        ``progress(sent, total)``, if given, is called as the file's bytes are sent.
        ``accounting`` (``hybrid``, ``basic``, ``gaussian`` or ``zcdp``; default: the
        service's) says how releases compose; ``mu_budget``/``rho_budget`` state the derived
        budget directly and ``delta_conversion`` the zcdp split (see the service's
        ``DatasetCreate``).
        ``planned_mechanisms``: the mechanisms the owner plans to use; the answer's
        ``recommended_accounting`` says which accounting fits them (advice only).

        The request carries an ``Idempotency-Key`` (random unless given). When its answer is
        lost on the way (the connection dropped or timed out after the file was sent), the
        file is sent once more with the same key: the service answers with the dataset the
        first request made, never a second dataset with a second budget on the same rows.
        """

        form: dict[str, str] = cost_fields(
            epsilon_budget=epsilon_budget,
            delta_budget=delta_budget,
            mu_budget=mu_budget,
            rho_budget=rho_budget,
            delta_conversion=delta_conversion,
        )
        if accounting is not None:
            form["accounting"] = accounting
        if allow_large_delta:
            form["allow_large_delta"] = "true"
        if planned_mechanisms is not None:
            form["planned_mechanisms"] = ",".join(planned_mechanisms)
        if row_norm_bound is not None:
            form["row_norm_bound"] = repr(float(row_norm_bound))
        if privacy_unit_column is not None:
            form["privacy_unit_column"] = str(privacy_unit_column)
        if not _is_path(data):
            names = feature_names(data)
            array = as_rows(data)
            if name is None:
                # A name a newcomer need not invent (names need not be unique): its shape, as
                # `dpss datasets list` shows it beside the name.
                # (the features': a privacy_unit_column is removed from them).
                features = array.shape[1] - (privacy_unit_column is not None)
                name = f"array-{array.shape[0]}x{features}"
            if isinstance(privacy_unit_column, str) and not privacy_unit_column.isdigit():
                # A .npy file has no column names: send the named column's index.
                if names is None or privacy_unit_column not in names:
                    raise ValueError(
                        f"privacy_unit_column {privacy_unit_column!r} is not one of the "
                        "array's column names; give its 0-based index instead"
                    )
                form["privacy_unit_column"] = str(names.index(privacy_unit_column))
            form["name"] = name
            file_name = f"{name}.npy"
            data = array
        else:
            form["name"] = name if name is not None else Path(data).stem  # type: ignore[arg-type]
            file_name = Path(data).name  # type: ignore[arg-type]
        response = self._post_file("/v1/datasets", data, file_name, form, progress, idempotency_key)
        return _parse(response, DatasetCreated)

    def _post_file(
        self,
        path: str,
        data: Any,
        file_name: str,
        form: dict[str, str] | None,
        progress: UploadProgress | None,
        idempotency_key: str | None,
    ) -> httpx.Response:
        """POST ``data`` (a path, streamed from disk, or a 2-D array, streamed as ``.npy``) as
        the ``file`` part with ``form``, under an ``Idempotency-Key`` (random unless given);
        sent once more with the same key when the answer is lost after the body went out."""
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        for attempt in (1, 2):
            try:
                if not _is_path(data):
                    with NpyStream(as_rows(data)) as stream:
                        total = stream.seek(0, os.SEEK_END)
                        stream.seek(0)
                        body: Any = (
                            stream if progress is None else _Reporting(stream, total, progress)
                        )
                        files = {"file": (file_name, body, "application/octet-stream")}
                        return self._request("POST", path, data=form, files=files, headers=headers)
                file_path = Path(data)
                content_type = _CONTENT_TYPES.get(
                    file_path.suffix.lower(), "application/octet-stream"
                )
                with file_path.open("rb") as fh:
                    sent: Any = fh
                    if progress is not None:
                        sent = _Reporting(fh, os.fstat(fh.fileno()).st_size, progress)
                    files = {"file": (file_name, sent, content_type)}
                    return self._request("POST", path, data=form, files=files, headers=headers)
            except ServiceUnreachableError as exc:
                # Refused connections never reached the service; anything later may have.
                if attempt == 2 or exc.code == "unreachable":
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def register_reference(
        self,
        uri: str,
        columns: list[str],
        *,
        name: str,
        epsilon_budget: Number,
        delta_budget: Number,
        row_norm_bound: float | None = None,
        allow_large_delta: bool = False,
        wait: bool = True,
        timeout: float | None = None,
    ) -> Dataset:
        """Register a Parquet dataset where it lives (owner key): ``s3://bucket/prefix/`` or a
        shared path under the service's ``DPSS_REFERENCE_ROOTS``, and its numeric ``columns``.
        The service reads it with its own credentials; nothing is uploaded.
        ``allow_large_delta``: accept a ``delta_budget`` above ``1/n`` (refused otherwise).

        The service answers at once with the dataset ``registering`` and a worker reads and
        checks the objects. With ``wait`` (default) this returns once it is ``ready`` (see
        :meth:`wait_registered`, which raises :class:`RegistrationFailed` with the reason if
        it failed); with ``wait=False``, the ``registering`` dataset at once."""
        body: dict[str, Any] = {
            "name": name,
            "uri": uri,
            "columns": list(columns),
            "epsilon_budget": _decimal_str(epsilon_budget, "epsilon_budget"),
            "delta_budget": _decimal_str(delta_budget, "delta_budget"),
        }
        if row_norm_bound is not None:
            body["row_norm_bound"] = float(row_norm_bound)
        if allow_large_delta:
            body["allow_large_delta"] = True
        dataset = _parse(self._request("POST", "/v1/dataset-references", json=body), Dataset)
        if not wait:
            return dataset
        return self.wait_registered(dataset.id, timeout=timeout)

    def wait_registered(
        self,
        dataset_id: UUID | str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
    ) -> Dataset:
        """Poll ``GET /v1/datasets/{id}`` until the dataset's registration has ended; return it
        when ``ready``. Raises :class:`RegistrationFailed` (with the service's reason) when it
        failed, :class:`WaitTimeoutError` after ``timeout`` seconds (it keeps registering).
        Pauses ``poll_interval`` seconds growing x1.5 up to ``max_poll_interval``."""
        start = _waits.time.monotonic()
        interval = poll_interval
        while True:
            dataset = self.dataset(dataset_id)
            if dataset.registration_status == "ready":
                return dataset
            if dataset.registration_status == "failed":
                raise RegistrationFailed(
                    "registration_failed",
                    f"dataset {dataset.id}: {dataset.registration_reason or 'no reason given'}",
                )
            elapsed = _waits.time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeoutError(
                    "timeout", f"dataset {dataset.id} still registering after {elapsed:.1f} s"
                )
            pause = interval if timeout is None else min(interval, timeout - elapsed)
            _waits._sleep(max(pause, 0.0))
            interval = min(interval * 1.5, max_poll_interval)

    def append_reference_batch(
        self,
        dataset_id: UUID | str,
        uri: str,
        *,
        wait: bool = True,
        timeout: float | None = None,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
    ) -> Dataset:
        """Append a batch of Parquet objects to a dataset registered by reference (owner key):
        ``uri`` names them as at registration (an object or a prefix under the service's
        ``DPSS_REFERENCE_ROOTS``), with the dataset's columns. A worker reads and checks them
        first; with ``wait`` (default) this returns the dataset once the batch is added (its
        ``n_batches`` one more), raising :class:`RegistrationFailed` with the reason if it was
        refused and :class:`WaitTimeoutError` after ``timeout`` seconds (it keeps
        registering); with ``wait=False``, the dataset with ``batch_status`` registering."""
        path = f"/v1/dataset-references/{dataset_id}/batches"
        dataset = _parse(self._request("POST", path, json={"uri": uri}), Dataset)
        start = _waits.time.monotonic()
        interval = poll_interval
        while wait and dataset.batch_status == "registering":
            elapsed = _waits.time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeoutError(
                    "timeout",
                    f"dataset {dataset.id}: batch still registering after {elapsed:.1f} s",
                )
            pause = interval if timeout is None else min(interval, timeout - elapsed)
            _waits._sleep(max(pause, 0.0))
            interval = min(interval * 1.5, max_poll_interval)
            dataset = self.dataset(dataset_id)
        if wait and dataset.batch_status == "failed":
            raise RegistrationFailed(
                "registration_failed",
                f"dataset {dataset.id}: batch: {dataset.batch_reason or 'no reason given'}",
            )
        return dataset

    def append_rows(
        self,
        dataset_id: UUID | str,
        data: str | os.PathLike[str] | ArrayLike,
        *,
        progress: UploadProgress | None = None,
        idempotency_key: str | None = None,
    ) -> DatasetBatch:
        """Append a batch of rows to a dataset (owner key); returns the batch with its sequence
        number. ``data`` is a ``.csv``/``.npy``/``.parquet`` path or a 2-D array, as for
        :meth:`upload`, with the dataset's number of columns. All of it is appended or none.
        As :meth:`upload`, under an ``Idempotency-Key`` (random unless given), resent once
        with it when the answer is lost: the batch is appended once."""
        file_name = "rows.npy" if not _is_path(data) else Path(data).name  # type: ignore[arg-type]
        response = self._post_file(
            f"/v1/datasets/{dataset_id}/rows", data, file_name, None, progress, idempotency_key
        )
        return _parse(response, DatasetBatch)

    def datasets(self) -> list[Dataset]:
        """Every dataset this key can see (metadata only), newest first, over all pages."""
        return list(self._pages("/v1/datasets", DatasetList, {}, None))

    def dataset(self, dataset_id: UUID | str) -> Dataset:
        return self._get(f"/v1/datasets/{dataset_id}", Dataset)

    def delete_dataset(self, dataset_id: UUID | str) -> None:
        """Purge a dataset's rows (owner key); its ledger and audit events stay."""
        self._request("DELETE", f"/v1/datasets/{dataset_id}")

    def budget(self, dataset_id: UUID | str) -> Budget:
        return self._get(f"/v1/datasets/{dataset_id}/budget", Budget)

    # Public priors ----------------------------------------------------------------------------

    def upload_prior(self, basis: ArrayLike, *, name: str | None = None) -> Prior:
        """Upload a public prior (analyst or owner key): a ``d x m`` basis with orthonormal
        columns, from public data or a fixed transform, never from the private rows. Name it in
        a release with ``prior_id=str(prior.id)``."""
        import numpy as np

        array = np.asarray(basis, dtype=np.float64)
        if array.ndim != 2:
            raise ValueError(f"the prior must be 2-D (d x m), got shape {array.shape}")
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        form = {"name": name} if name is not None else {}
        response = self._request(
            "POST",
            "/v1/priors",
            data=form,
            files={"file": ("prior.npy", buffer.getvalue(), "application/octet-stream")},
        )
        return _parse(response, Prior)

    def priors(self) -> list[Prior]:
        """Every stored public prior (metadata), newest first, over all pages."""
        return list(self._pages("/v1/priors", PriorList, {}, None))

    def prior(self, prior_id: UUID | str) -> PriorWithBasis:
        """A prior's metadata and basis."""
        return self._get(f"/v1/priors/{prior_id}", PriorWithBasis)

    # Grants ---------------------------------------------------------------------------------

    def create_grant(
        self,
        dataset_id: UUID | str,
        epsilon: Number | None = None,
        delta: Number | None = None,
        *,
        mu: Number | None = None,
        rho: Number | None = None,
        analyst_key_id: UUID | str | None = None,
    ) -> Grant:
        """Give an analyst key (every analyst if ``analyst_key_id`` is None) a share of a
        dataset's budget (owner key), in its currency: ``epsilon, delta`` (basic), ``mu=`` or
        ``rho=`` (gaussian), ``rho=`` with ``delta`` (zcdp). Releases are then charged to the
        grant and the dataset."""
        body: dict[str, Any] = {
            **cost_fields(epsilon=epsilon, delta=delta, mu=mu, rho=rho),
            "analyst_key_id": None if analyst_key_id is None else str(analyst_key_id),
        }
        response = self._request("POST", f"/v1/datasets/{dataset_id}/grants", json=body)
        return _parse(response, Grant)

    def list_grants(self, dataset_id: UUID | str) -> list[Grant]:
        """A dataset's grants, oldest first, each with what it spent and has left (owner key)."""
        return self._get(f"/v1/datasets/{dataset_id}/grants", GrantList).items

    def revoke_grant(self, dataset_id: UUID | str, grant_id: UUID | str) -> Grant:
        """Revoke a grant (owner key): no further charges; what it spent stays spent."""
        response = self._request("DELETE", f"/v1/datasets/{dataset_id}/grants/{grant_id}")
        return _parse(response, Grant)

    # Releases -------------------------------------------------------------------------------

    def release(
        self,
        dataset_id: UUID | str,
        mechanism: str | None = None,
        k: int | None = None,
        epsilon: Number | None = None,
        delta: Number | None = None,
        *,
        mu: Number | None = None,
        rho: Number | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
        **params: Any,
    ) -> ReleaseHandle:
        """Request a release (analyst key); it is queued, and the cost charged, at once.

        ``wait`` seconds (at most :data:`LONG_POLL_SECONDS`): the request itself waits for the
        release (``POST ...?wait=``) and the handle comes back finished when it finished within
        that time (one request instead of the request and a long poll; as ever, an analyst sees
        the outcome only from its ``visible_at`` on), else unfinished (then
        :meth:`ReleaseHandle.wait_finished`). The release's id is known only once the request
        answers; a request whose answer is lost on the way is sent once more with the same
        ``Idempotency-Key`` (the same release, charged once). A service without this long
        poll answers at once, as without ``wait``.

        The cost: ``epsilon, delta`` (on a ``basic`` dataset the charge; elsewhere the single
        release the mechanism is calibrated to, charged its own cost), or ``mu=`` on a
        ``gaussian`` dataset, or ``rho=`` (with ``delta`` for approximate steps) on a ``zcdp``
        one.

        ``mechanism``: omitted (``None``), ``"auto"`` (:data:`DEFAULT_MECHANISM`), what the
        API advises when unsure and what ``dpss releases create`` sends by default: the service
        chooses and says what and why (``auto_choice``, ``auto_reason``). ``k`` is required
        (positionally third, as before, or ``k=``); ``delta`` omitted with ``epsilon`` is the
        service's default (min(1e-6, delta_total/100); under a grant at most its delta/100).

        Keyword arguments other than ``idempotency_key`` are the mechanism's parameters (see
        :meth:`mechanisms`). The request carries an ``Idempotency-Key`` (random unless given),
        so sending the same request again with the same key never charges twice.
        """
        with defaulted_mechanism(mechanism):
            return self._release(
                dataset_id,
                mechanism or DEFAULT_MECHANISM,
                _required_k(k, "release"),
                epsilon,
                delta,
                mu=mu,
                rho=rho,
                idempotency_key=idempotency_key,
                wait=wait,
                **params,
            )

    def _release(
        self,
        dataset_id: UUID | str,
        mechanism: str,
        k: int,
        epsilon: Number | None,
        delta: Number | None,
        *,
        mu: Number | None,
        rho: Number | None,
        idempotency_key: str | None,
        wait: float | None,
        **params: Any,
    ) -> ReleaseHandle:
        body = {
            "mechanism": mechanism,
            "k": k,
            **cost_fields(epsilon=epsilon, delta=delta, mu=mu, rho=rho),
            "params": params,
        }
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        path, headers = f"/v1/datasets/{dataset_id}/releases", {"Idempotency-Key": key}
        if wait is not None and wait > 0 and not self._no_release_wait:
            seconds = min(wait, _waits.LONG_POLL_SECONDS)
            try:
                response = self._request(
                    "POST",
                    path,
                    json=body,
                    headers=headers,
                    params={"wait": f"{seconds:g}", **self._release_read()},
                    timeout=self._timeout_plus(seconds),
                )
                return ReleaseHandle(self, _parse(response, Release))
            except ServiceUnreachableError:
                pass  # charged or not: the same key below gives the same release, or makes it
            except InvalidRequestError as exc:
                # A service from before these parameters refuses them, before any charge.
                if _unknown_query(exc, "wait"):
                    self._no_release_wait = True
                elif _unknown_query(exc, "basis_format"):
                    self._no_basis_format = True
                    return self._release(
                        dataset_id, mechanism, k, epsilon, delta, mu=mu, rho=rho,
                        idempotency_key=key, wait=wait, **params,
                    )  # fmt: skip
                else:
                    raise
        response = self._request("POST", path, json=body, headers=headers)
        return ReleaseHandle(self, _parse(response, Release))

    def preview_release(
        self,
        dataset_id: UUID | str,
        mechanism: str | None = None,
        k: int | None = None,
        epsilon: Number | None = None,
        delta: Number | None = None,
        *,
        mu: Number | None = None,
        rho: Number | None = None,
        **params: Any,
    ) -> ReleasePreview:
        """What :meth:`release` would cost and use, charging nothing (analyst key).

        The service validates the request exactly as a real one (same errors), and answers
        with the cost, whether the budget covers it (``affordable``), and the noise scales the
        mechanism would use (``scales``) with what they mean (``meaning``). ``mechanism`` and
        ``k`` as :meth:`release` (omitted mechanism: ``"auto"``). Keyword arguments are the
        mechanism's parameters.
        """
        body = {
            "mechanism": mechanism or DEFAULT_MECHANISM,
            "k": _required_k(k, "preview_release"),
            **cost_fields(epsilon=epsilon, delta=delta, mu=mu, rho=rho),
            "params": params,
        }
        with defaulted_mechanism(mechanism):
            response = self._request(
                "POST",
                f"/v1/datasets/{dataset_id}/releases",
                params={"dry_run": "true"},
                json=body,
            )
        return _parse(response, ReleasePreview)

    def releases_page(
        self,
        *,
        dataset_id: UUID | str | None = None,
        status: ReleaseStatus | None = None,
        mechanism: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        with_basis: bool = False,
    ) -> ReleasePage:
        """One page of release history, newest first, with the ``total`` of all pages.

        An analyst key lists its own releases, an owner key the releases of its datasets. Times
        must be timezone-aware. Pass the page's ``next`` as ``cursor`` for the following page.
        """
        query = _release_filters(
            dataset_id, status, mechanism, created_after, created_before, with_basis
        )
        if limit is not None:
            query["limit"] = str(limit)
        if cursor is not None:
            query["cursor"] = cursor
        return self._get("/v1/releases", ReleasePage, params=query)

    def list_releases(
        self,
        *,
        dataset_id: UUID | str | None = None,
        status: ReleaseStatus | None = None,
        mechanism: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int | None = None,
        with_basis: bool = False,
    ) -> Iterator[Release]:
        """Every matching release, newest first, fetching pages as the iteration needs them.

        Releases made while iterating do not appear (they are newer than the first page) and
        never cause one to be skipped or repeated.
        """
        query = _release_filters(
            dataset_id, status, mechanism, created_after, created_before, with_basis
        )
        return self._pages("/v1/releases", ReleasePage, query, page_size)

    def get_release(self, release_id: UUID | str) -> ReleaseHandle:
        """A handle on an existing release (e.g. one requested earlier from the CLI)."""
        return ReleaseHandle(self, self._get_release(f"/v1/releases/{release_id}"))

    # Catalogue and audit --------------------------------------------------------------------

    def mechanisms(self) -> list[MechanismInfo]:
        return self._get("/v1/mechanisms", MechanismList).items

    def workers_alive(self) -> int | None:
        """How many workers the service reports alive (``GET /readyz``); ``None`` when it does
        not say (a service from before the figure) or cannot answer now."""
        try:
            body = self._request("GET", "/readyz").json()
        except (DpssError, ValueError):
            return None
        count = body.get("workers_alive") if isinstance(body, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def audit(self, *, after: int | None = None, limit: int | None = None) -> AuditPage:
        """One page of audit events (auditor or admin key), in chain order after ``after``."""
        query: dict[str, int] = {}
        if after is not None:
            query["after"] = after
        if limit is not None:
            query["limit"] = limit
        return self._get("/v1/audit", AuditPage, params=query)

    # Keys (admin) -------------------------------------------------------------------------

    def keys(self) -> list[KeyInfo]:
        """Every API key, oldest first, revoked ones included (never their secrets)."""
        return list(self._pages("/v1/keys", KeyPage, {}, None))

    def create_key(self, role: Role, name: str) -> KeyCreated:
        """A new key; its secret is in the answer and never shown again."""
        response = self._request("POST", "/v1/keys", json={"role": role, "name": name})
        return _parse(response, KeyCreated)

    def revoke_key(self, key_id: UUID | str) -> None:
        self._request("DELETE", f"/v1/keys/{key_id}")

    # Paging -----------------------------------------------------------------------------------

    def _pages(
        self,
        path: str,
        model: type[_Page],
        query: dict[str, str],
        page_size: int | None,
    ) -> Iterator[Any]:
        """Every item of a cursor-paged list (``{"items", "total", "next"}``)."""
        params = dict(query)
        if page_size is not None:
            params["limit"] = str(page_size)
        while True:
            page = self._get(path, model, params=params)
            yield from page.items
            if page.next is None or not page.items:
                return
            params["cursor"] = page.next

    def audit_events(
        self, *, after: int | None = None, page_size: int | None = None
    ) -> Iterator[AuditEvent]:
        """Every audit event after ``after``, following the pages."""
        cursor = after
        while True:
            page = self.audit(after=cursor, limit=page_size)
            yield from page.items
            if page.next_after is None or not page.items:
                return
            cursor = page.next_after
