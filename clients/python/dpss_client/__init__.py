"""dpss-client: the slim Python client of dp-subspace-service.

Talks HTTP to a running service and never imports the server: it needs httpx, numpy, pydantic
(and typer and rich for the ``dpss-remote`` command). The wire schemas it shares with the server
are the ``api_schemas`` package of the same distribution.

>>> from dpss_client import Client, PrivatePCA
>>> with Client("http://127.0.0.1:8000", api_key) as dpss:              # doctest: +SKIP
...     pca = PrivatePCA(dpss, dataset_id, n_components=10, epsilon="1", delta="1e-6",
...                      center="private").fit()
...     z = pca.transform(my_rows)
"""

from __future__ import annotations

from dpss_client.client import (
    DEFAULT_URL,
    AuthError,
    BudgetExceededError,
    Client,
    ConflictError,
    DpssError,
    InvalidRequestError,
    NoBasisError,
    NotFoundError,
    RegistrationFailed,
    ReleaseFailed,
    ReleaseHandle,
    ReleaseNoResult,
    ReleaseOutcomeError,
    ServerError,
    ServiceUnreachableError,
    WaitTimeoutError,
)
from dpss_client.pca import NotFittedError, PrivatePCA

__all__ = [
    "DEFAULT_URL",
    "AuthError",
    "BudgetExceededError",
    "Client",
    "ConflictError",
    "DpssError",
    "InvalidRequestError",
    "NoBasisError",
    "NotFittedError",
    "NotFoundError",
    "PrivatePCA",
    "RegistrationFailed",
    "ReleaseFailed",
    "ReleaseHandle",
    "ReleaseNoResult",
    "ReleaseOutcomeError",
    "ServerError",
    "ServiceUnreachableError",
    "WaitTimeoutError",
]
