"""Examples for the manual: a request body for each operation that takes one, a response body for
each schema a successful operation answers with, and an error body for each error status.

:func:`service.api.openapi.truthful_openapi` attaches them to the operations; a test validates
every one against the schema it illustrates (tests/api/test_docs_examples.py). The values are
made up but shaped as the service answers (decimals as strings, ids as UUIDs).
"""

from __future__ import annotations

from typing import Any

OWNER_KEY_ID = "0b7e4a52-3c1d-4f0e-9d2a-5b8f6c1e2a10"
ANALYST_KEY_ID = "5f0c9e1d-7a2b-4c3d-8e4f-1a2b3c4d5e6f"
DATASET_ID = "3fa85f64-5717-4562-b3fc-2c963f66afa6"
RELEASE_ID = "9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f"
GRANT_ID = "7d8e9f0a-1b2c-4d3e-8f4a-5b6c7d8e9f0a"
CREATED = "2026-11-23T01:00:00Z"

#: Request bodies by (method, path template) and media type.
REQUESTS: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/keys"): {"role": "analyst", "name": "digits team"},
    ("post", "/v1/datasets"): {
        "file": "digits.csv",
        "name": "digits",
        "epsilon_budget": "3",
        "delta_budget": "1e-5",
        "row_norm_bound": "16",
    },
    ("post", "/v1/datasets/{dataset_id}/releases"): {
        "mechanism": "analyze_gauss",
        "k": 2,
        "epsilon": "0.5",
        "delta": "1e-6",
        "params": {},
    },
    ("post", "/v1/datasets/{dataset_id}/grants"): {
        "analyst_key_id": ANALYST_KEY_ID,
        "epsilon": "1",
        "delta": "1e-6",
    },
}

_BUDGET = {
    "epsilon_total": "3",
    "delta_total": "0.00001",
    "epsilon_spent": "0.5",
    "delta_spent": "0.000001",
    "epsilon_remaining": "2.5",
    "delta_remaining": "0.000009",
}
_DATASET = {
    "id": DATASET_ID,
    "name": "digits",
    "n_rows": 1797,
    "n_cols": 64,
    "row_norm_bound": 16.0,
    "budget": _BUDGET,
    "created_at": CREATED,
}
_RELEASE = {
    "id": RELEASE_ID,
    "dataset_id": DATASET_ID,
    "mechanism": "analyze_gauss",
    "k": 2,
    "epsilon": "0.5",
    "delta": "0.000001",
    "params": {},
    "status": "succeeded",
    "reason": None,
    "refunded": False,
    "result": {
        "basis": [[0.6, 0.8], [0.8, -0.6]],
        "basis_sha256": "5e9f1c0a7b3d2e4f6a8b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f",
        "extras": {},
    },
    "created_at": CREATED,
    "visible_at": CREATED,
    "started_at": "2026-11-23T01:00:01Z",
    "finished_at": "2026-11-23T01:00:02Z",
    "attempts": 1,
}
_GRANT = {
    "id": GRANT_ID,
    "dataset_id": DATASET_ID,
    "analyst_key_id": ANALYST_KEY_ID,
    "epsilon_total": "1",
    "delta_total": "0.000001",
    "epsilon_spent": "0.5",
    "delta_spent": "0.0000005",
    "epsilon_remaining": "0.5",
    "delta_remaining": "0.0000005",
    "created_at": CREATED,
    "revoked_at": None,
}
_KEY_INFO = {
    "id": ANALYST_KEY_ID,
    "role": "analyst",
    "name": "digits team",
    "created_at": CREATED,
    "revoked_at": None,
}

#: Response bodies by the component schema a successful response refers to.
RESPONSES: dict[str, Any] = {
    "Health": {"status": "ok"},
    "KeyCreated": {
        "id": ANALYST_KEY_ID,
        "role": "analyst",
        "name": "digits team",
        "key": "dpss_3q2x7Zc9VhKfN0aLr8TbW4uYp6Ms1EjD",
    },
    "KeyPage": {"items": [_KEY_INFO], "total": 1, "next": None},
    "Dataset": _DATASET,
    "DatasetList": {"items": [_DATASET], "total": 1, "next": None},
    "Budget": _BUDGET,
    "Release": _RELEASE,
    "ReleasePage": {"items": [_RELEASE], "total": 1, "next": None},
    "ReleasePreview": {
        "dry_run": True,
        "dataset_id": DATASET_ID,
        "mechanism": "analyze_gauss",
        "k": 2,
        "epsilon": "0.5",
        "delta": "0.000001",
        "params": {},
        "affordable": True,
        "epsilon_remaining": "2.5",
        "delta_remaining": "0.000009",
        "budget": "dataset",
        "grant_id": None,
        "memory_mb": 0.1,
        "scales": {"sigma": 2380.5},
        "meaning": [
            "The noise matrix has a spectral norm of about 3.8e4; the subspace error stays "
            "below 0.1 when the k-th eigengap of X^T X exceeds about 7.6e5."
        ],
    },
    "Grant": _GRANT,
    "GrantList": {"items": [_GRANT], "total": 1, "next": None},
    "MechanismList": {
        "items": [
            {
                "name": "analyze_gauss",
                "title": "Analyze Gauss",
                "paper": "Dwork, Talwar, Thakurta, Zhang, STOC 2014",
                "summary": "Gaussian noise on X^T X, then its top-k eigenvectors.",
                "cost_rule": "(epsilon, delta) as requested; delta > 0",
                "allows_pure_dp": False,
                "releases_basis": True,
                "params_schema": {"type": "object", "properties": {}},
            }
        ]
    },
    "AuditPage": {
        "items": [
            {
                "seq": 1,
                "event_type": "dataset.created",
                "actor_key_id": OWNER_KEY_ID,
                "dataset_id": DATASET_ID,
                "release_id": None,
                "created_at": CREATED,
                "details": {"n_rows": 1797, "n_cols": 64},
                "prev_hash": "0" * 64,
                "hash": "a3f1c2d4e5b6a7980112233445566778899aabbccddeeff00112233445566778",
            }
        ],
        "next_after": None,
        "total": 1,
        "next": None,
    },
}

#: Error bodies by status.
ERRORS: dict[int, dict[str, Any]] = {
    400: {"error": "bad_request", "detail": "the body is not valid UTF-8 JSON"},
    401: {"error": "unauthenticated", "detail": "missing or invalid API key"},
    403: {"error": "forbidden", "detail": "this key's role may not do this"},
    404: {"error": "not_found", "detail": "no such dataset"},
    409: {"error": "conflict", "detail": "the request conflicts with the resource's state"},
    413: {"error": "payload_too_large", "detail": "the body is larger than its limit"},
    422: {"error": "invalid_input", "detail": "k: must be at most the number of columns"},
    429: {"error": "rate_limited", "detail": "too many requests for this key; retry after 1 s"},
    503: {
        "error": "service_unavailable",
        "detail": "the database is unavailable; retry later",
        "retry_after": 2,
    },
    507: {"error": "insufficient_storage", "detail": "the server's disk is full"},
}
BUDGET_EXCEEDED = {
    "error": "budget_exceeded",
    "detail": "the request needs more budget than remains",
    "epsilon_remaining": "0.2",
    "delta_remaining": "0",
    "budget": "dataset",
    "grant_id": None,
}


def example(value: Any, summary: str) -> dict[str, Any]:
    """An OpenAPI Example Object."""
    return {"summary": summary, "value": value}
