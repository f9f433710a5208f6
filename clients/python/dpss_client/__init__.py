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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        NoWorkerWarning,
        RegistrationFailed,
        ReleaseFailed,
        ReleaseHandle,
        ReleaseNoResult,
        ReleaseOutcomeError,
        ServerError,
        ServiceTimeoutError,
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
    "NoWorkerWarning",
    "NotFittedError",
    "NotFoundError",
    "PrivatePCA",
    "RegistrationFailed",
    "ReleaseFailed",
    "ReleaseHandle",
    "ReleaseNoResult",
    "ReleaseOutcomeError",
    "ServerError",
    "ServiceTimeoutError",
    "ServiceUnreachableError",
    "WaitTimeoutError",
]

#: Where each public name lives. Imported on first use (PEP 562), not with the package: the
#: ``dpss`` command imports ``dpss_client.remote_cli`` at start, and its ``--help`` needs neither
#: numpy nor httpx nor pydantic (bench/bench_cli_startup.py).
_HOME = {
    name: "dpss_client.pca" if name in ("NotFittedError", "PrivatePCA") else "dpss_client.client"
    for name in __all__
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'dpss_client' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
