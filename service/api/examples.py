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
        "file": "survey.csv",
        "name": "survey",
        "epsilon_budget": "3",
        "delta_budget": "1e-5",
        "row_norm_bound": "1",
    },
    ("post", "/v1/dataset-references"): {
        "name": "lake",
        "epsilon_budget": "3",
        "delta_budget": "1e-5",
        "row_norm_bound": "1",
        "accounting": "zcdp",
        "uri": "s3://analytics-lake/survey/",
        "columns": ["x0", "x1", "x2"],
    },
    ("post", "/v1/dataset-references/{dataset_id}/batches"): {
        "uri": "s3://analytics-lake/survey/week-2.parquet"
    },
    ("post", "/v1/datasets/{dataset_id}/rows"): {"file": "survey-week-2.csv"},
    ("post", "/v1/datasets/{dataset_id}/releases"): {
        "mechanism": "analyze_gauss",
        "k": 2,
        "epsilon": "0.5",
        "delta": "1e-6",
        "params": {"clip_norm": 1.0},
    },
    ("post", "/v1/priors"): {"file": "dct64.npy", "name": "2-D DCT, 64 lowest frequencies"},
    ("post", "/v1/datasets/{dataset_id}/grants"): {
        "analyst_key_id": ANALYST_KEY_ID,
        "epsilon": "1",
        "delta": "1e-6",
    },
}

# A dataset uploaded with the defaults (hybrid accounting), (3, 1e-5), after one
# analyze_gauss release of (0.5, 1e-6) charged to _GRANT: figures from a live service.
_BUDGET = {
    "privacy_unit": "row",
    "accounting": "hybrid",
    "epsilon_total": "3",
    "delta_total": "0.00001",
    "epsilon_spent": "0.431032421012999500155757937136",
    "delta_spent": "0.0000001",
    "epsilon_remaining": "2.568967578987000499844242062864",
    "delta_remaining": "0.0000002",
    "rho_total": "0.15726538716836789826519042047",
    "rho_spent": "0.007701168104387063284195567873",
    "rho_remaining": "0.149564219063980834980994852597",
    "mu_total": "0.717656701833903105701045692201",
    "mu_spent": "0.124106148956343523182260887726",
    "mu_remaining": "0.706844258290566846922527910562",
    "delta_conversion": "0.0000001",
    "delta_reserved_for_conversion": "0.0000097",
}
_DATASET = {
    "id": DATASET_ID,
    "name": "survey",
    "n_rows": 1000,
    "n_cols": 4,
    "n_batches": 1,
    "row_norm_bound": 1.0,
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
    "rho": "0.007701168104387063284195567873",
    "cost_delta": "0",
    "params": {"clip_norm": 1.0},
    "status": "succeeded",
    "reason": None,
    "refunded": False,
    "result": {
        # d = 4 rows of k = 2 floats, orthonormal columns.
        "basis": [[0.5, 0.5], [0.5, -0.5], [0.5, 0.5], [0.5, -0.5]],
        "basis_sha256": "b9fbc5a1d1ab608dfd2cf017ef63f841be3945214f2ee15e31a49eb611feb2a9",
        "extras": {"eigenvalues": [158.9, 43.6]},
    },
    "created_at": CREATED,
    "visible_at": CREATED,
    "started_at": "2026-11-23T01:00:01Z",
    "finished_at": "2026-11-23T01:00:02Z",
    "attempts": 1,
}
_EPOCH = {
    "epoch": 2,
    "batch_seq": 1,
    "n_rows_read": 250,
    "basis_sha256": "b9fbc5a1d1ab608dfd2cf017ef63f841be3945214f2ee15e31a49eb611feb2a9",
    "basis": [[0.5, 0.5], [0.5, -0.5], [0.5, 0.5], [0.5, -0.5]],
    "extras": {"epoch": 2, "horizon": 16, "estimator": "honaker", "noise_sigma": 13.36},
    "created_at": "2026-11-24T01:00:00Z",
}
_GRANT = {
    "id": GRANT_ID,
    "dataset_id": DATASET_ID,
    "analyst_key_id": ANALYST_KEY_ID,
    "analyst_key_name": "bob",
    "epsilon_total": "1",
    "delta_total": "0.000001",
    "epsilon_spent": "0.431032421012999500155757937136",
    "delta_spent": "0.00000001",
    "epsilon_remaining": "0.568967578987000499844242062864",
    "delta_remaining": "0.00000002",
    "accounting": "hybrid",
    "rho_total": "0.017205318039373676306240264047",
    "rho_spent": "0.007701168104387063284195567873",
    "rho_remaining": "0.009504149934986613022044696174",
    "mu_total": "0.236236301151729277911120606065",
    "mu_spent": "0.124106148956343523182260887726",
    "mu_remaining": "0.201010581246551300023582768435",
    "delta_reserved_for_conversion": "0.00000097",
    "privacy_unit": "row",
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
_PRIOR = {
    "id": "2b1c0d9e-8f7a-4b6c-9d5e-3f2a1b0c9d8e",
    "name": "2-D DCT, 64 lowest frequencies",
    "source": "upload",
    "d": 784,
    "m": 64,
    "sha256": "5d41402abc4b2a76b9719d911017c592" * 2,
    "created_at": CREATED,
}

RESPONSES: dict[str, Any] = {
    "Health": {"status": "ok"},
    "Readiness": {"status": "ok", "workers_alive": 2},
    "KeyCreated": {
        "id": ANALYST_KEY_ID,
        "role": "analyst",
        "name": "digits team",
        "key": "dpss_3q2x7Zc9VhKfN0aLr8TbW4uYp6Ms1EjD",
    },
    "KeyPage": {"items": [_KEY_INFO], "total": 1, "next": None},
    "Dataset": _DATASET,
    "DatasetCreated": {**_DATASET, "rows_above_bound": 3},
    "DatasetList": {"items": [_DATASET], "total": 1, "next": None},
    "Prior": _PRIOR,
    "PriorList": {"items": [_PRIOR], "total": 1, "next": None},
    "PriorWithBasis": {**_PRIOR, "d": 3, "m": 2, "basis": [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]},
    "DatasetBatch": {
        "dataset_id": DATASET_ID,
        "seq": 1,
        "n_rows": 250,
        "n_rows_total": 1250,
        "n_batches": 2,
        "created_at": "2026-11-24T01:00:00Z",
    },
    "EpochList": {"items": [_EPOCH], "total": 2, "next": None},
    "Budget": _BUDGET,
    "Release": _RELEASE,
    "ReleasePage": {"items": [_RELEASE], "total": 1, "next": None},
    "ReleasePreview": {
        "dry_run": True,
        "dataset_id": DATASET_ID,
        "privacy_unit": "row",
        "mechanism": "analyze_gauss",
        "k": 2,
        "epsilon": "0.5",
        "delta": "0.000001",
        "params": {"clip_norm": 1.0},
        "accounting": "hybrid",
        "mu": "0.124106148956343523182260887726",
        "rho": "0.007701168104387063284195567873",
        "zcdp_delta": "0",
        "rho_remaining": "0.009504149934986613022044696174",
        "mu_remaining": "0.201010581246551300023582768435",
        "delta_reserved_for_conversion": "0.00000097",
        "releases_remaining": 2,
        "affordable": True,
        "epsilon_remaining": "0.568967578987000499844242062864",
        "delta_remaining": "0.00000002",
        "budget": "grant",
        "grant_id": GRANT_ID,
        "memory_mb": 0.244,
        "scales": {
            "sigma": 12.011588,
            "noise_spectral_norm": 48.046354,
            "gap_for_error_0_1": 528.509892,
            "eigenvalue_grid": 0.012012,
            "total_mu": 0.124106,
            "gram_mu": 0.117737,
        },
        "meaning": [
            "Each entry of the upper triangle of the clipped X^T X gets Gaussian noise of "
            "standard deviation sigma = 12.01.",
            "The symmetric noise matrix has spectral norm about 2 sigma sqrt(d) = 48.05; each "
            "released eigenvalue is within about that much of the true one (Weyl).",
            "For a subspace error ||sin Theta|| <= 0.1 the k-th eigengap lambda_k - lambda_(k+1) "
            "of the clipped X^T X must be at least about 528.5 (Davis-Kahan with Weyl: "
            "error <= ||E|| / (gap - ||E||)).",
        ],
        "admitted_by": ["gdp", "zcdp"],
        "warnings": [],
    },
    "Grant": _GRANT,
    "GrantList": {"items": [_GRANT], "total": 1, "next": None},
    "MechanismList": {
        "items": [
            {
                "name": "analyze_gauss",
                "title": "Analyze Gauss (Gaussian noise on X^T X)",
                "paper": "Dwork, Talwar, Thakurta & Zhang, Analyze Gauss: Optimal Bounds for "
                "Privacy-Preserving PCA, STOC 2014, Algorithm 1",
                "summary": "Adds a symmetric Gaussian matrix calibrated to sqrt(2) C^2 to the "
                "clipped X^T X and releases its top-k eigenvectors and eigenvalues.",
                "cost_rule": "Charges exactly the requested (epsilon, delta).",
                "allows_pure_dp": False,
                "releases_basis": True,
                "accountings": ["basic", "gaussian", "hybrid", "zcdp"],
                "params_schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "clip_norm": {
                            "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
                            "default": None,
                            "description": "Public row norm bound C; defaults to the "
                            "dataset's row_norm_bound.",
                        }
                    },
                },
            }
        ],
        "total": 1,
        "next": None,
    },
    "AuditPage": {
        "items": [
            {
                "seq": 1,
                "event_type": "key_created",
                "actor_key_id": None,
                "dataset_id": None,
                "release_id": None,
                "created_at": CREATED,
                "details": {"key_id": OWNER_KEY_ID, "role": "owner", "name": "survey owners"},
                "prev_hash": "0" * 64,
                "hash": "a3f1c2d4e5b6a7980112233445566778899aabbccddeeff00112233445566778",
            }
        ],
        "next_after": None,
        "total": 1,
        "next": None,
    },
}

_WORKER_ID = "worker-1:4242:a1b2c3"
_OPERATIONS: dict[str, Any] = {
    "Whoami": {"id": OWNER_KEY_ID, "role": "owner", "name": "survey owners"},
    "WorkerList": {
        "items": [
            {
                "worker_id": _WORKER_ID,
                "started_at": CREATED,
                "last_seen_at": "2026-11-23T01:05:00Z",
                "alive": True,
                "running_release_id": RELEASE_ID,
            }
        ],
        "total": 1,
        "alive": 1,
        "next": None,
    },
    "QueueState": {
        "queued": 0,
        "running": 1,
        "oldest_queued_at": None,
        "oldest_queued_age_seconds": None,
        "items": [
            {
                "release_id": RELEASE_ID,
                "dataset_id": DATASET_ID,
                "mechanism": "analyze_gauss",
                "k": 2,
                "status": "running",
                "attempts": 1,
                "created_at": CREATED,
                "lease_owner": _WORKER_ID,
                "lease_expires_at": "2026-11-23T01:00:40Z",
            }
        ],
    },
    "LedgerPage": {
        "items": [
            {
                "id": 1,
                "release_id": RELEASE_ID,
                "kind": "charge",
                "epsilon": "0.5",
                "delta": "0.000001",
                "rho": "0.007701168104387063284195567873",
                "mu": "0.124106148956343523182260887726",
                "epsilon_after": "0.431032421012999500155757937136",
                "epsilon_increment": "0.431032421012999500155757937136",
                "grant_id": GRANT_ID,
                "created_at": CREATED,
            }
        ],
        "total": 1,
        "next": None,
        "accounting": "hybrid",
        "stated_at_delta": "0.00001",
        "privacy_unit": "row",
    },
    "MyGrantList": {"items": [_GRANT], "total": 1, "next": None},
    "AuditVerification": {
        "ok": True,
        "checked": 12,
        "problems": [],
        "notes": ["the chain contains the anchored event 10"],
        "head": "12:" + "5" * 64,
        "anchor": "10:" + "4" * 64,
        "anchor_found": True,
        "macs_checked": False,
        "verified_at": "2026-11-23T02:00:00Z",
    },
}
RESPONSES.update(_OPERATIONS)

#: Error bodies by status.
ERRORS: dict[int, dict[str, Any]] = {
    400: {"error": "bad_request", "detail": "the body is not valid UTF-8 JSON"},
    401: {"error": "unauthenticated", "detail": "missing or invalid API key"},
    403: {"error": "forbidden", "detail": "this key's role may not do this"},
    404: {"error": "not_found", "detail": "no such dataset"},
    408: {"error": "request_timeout", "detail": "the body was not received in time"},
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
