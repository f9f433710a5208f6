"""dpss_client.spelling: the API's field names in each client surface's spelling."""

from __future__ import annotations

import pytest

from dpss_client.spelling import CLI_GRANT, CLI_RELEASE, CLI_UPLOAD, PRIVATE_PCA, Spelling

MISSING_COST = (
    'epsilon: required: "epsilon", "mu" or "rho" (the release\'s cost), e.g. "epsilon": 0.5; '
    '"delta" is optional: without it the release gets min(1e-6, delta_total / 100) of the '
    "dataset's delta"
)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        (
            CLI_RELEASE,
            "--epsilon: required: --epsilon, --mu or --rho (the release's cost), e.g. --epsilon "
            "0.5; --delta is optional: without it the release gets min(1e-6, delta_total / 100) "
            "of the dataset's delta",
        ),
        (
            PRIVATE_PCA,
            "epsilon: required: epsilon, mu or rho (the release's cost), e.g. epsilon=0.5; "
            "delta is optional: without it the release gets min(1e-6, delta_total / 100) of the "
            "dataset's delta",
        ),
    ],
)
def test_the_missing_cost_in_each_surface(spelling: Spelling, expected: str) -> None:
    assert spelling.respell(MISSING_COST) == expected


@pytest.mark.parametrize(
    ("spelling", "detail", "expected"),
    [
        (PRIVATE_PCA, "k: must be <= the number of columns (20)", "n_components: must be <="),
        (CLI_RELEASE, "k: must be <= the number of columns (20)", "--k: must be <="),
        # Several locations (the API's validation joins them with "; ").
        (PRIVATE_PCA, "mu: invalid; k: too large", "mu: invalid; n_components: too large"),
        (PRIVATE_PCA, "params.clip_quantile: unknown field", "clip_quantile: unknown field"),
        (CLI_RELEASE, "params.clip_quantile: unknown field", "--param clip_quantile: unknown"),
        (
            CLI_RELEASE,
            'x (go inside params: "params": {"center": "private"})',
            "x (go inside params: --param center=private)",
        ),
        (
            PRIVATE_PCA,
            'x (go inside params: "params": {"center": "private"})',
            'x (go inside params: center="private")',
        ),
        (CLI_RELEASE, "a dry run, `dry_run=true`, prices", "a dry run, `--dry-run`, prices"),
        (
            PRIVATE_PCA,
            "a dry run, `dry_run=true`, prices",
            "a dry run, `client.preview_release(...)`, prices",
        ),
        (CLI_UPLOAD, "delta_budget: or send `allow_large_delta=true`", "--delta-budget: or send "),
    ],
)
def test_locations_examples_params_and_queries(
    spelling: Spelling, detail: str, expected: str
) -> None:
    assert spelling.respell(detail).startswith(expected), spelling.respell(detail)


@pytest.mark.parametrize(
    "detail",
    [
        # Bare words are quantities, not options; unmapped fields and values stay as sent.
        "this release costs more than the dataset's remaining budget: epsilon 0.2 left",
        "the dataset's delta; rank-k release; n=5000, d=20, k=3",
        'name: "private" is taken',
        "budget_exceeded",
    ],
)
def test_what_is_not_a_mapped_field_is_left_alone(detail: str) -> None:
    for spelling in (CLI_RELEASE, CLI_UPLOAD, PRIVATE_PCA, CLI_GRANT):
        if spelling is CLI_UPLOAD and detail.startswith("name:"):
            continue  # --name is an upload option
        assert spelling.respell(detail) == detail


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        # service/grants.py's refusals, as `dpss grants create` prints them.
        (
            "epsilon: required (with delta, default the dataset's delta_total)",
            "--epsilon: required (with delta, default the dataset's delta_total)",
        ),
        (
            "analyst_key_id: must be the id of an active analyst key",
            "--analyst-key-id: must be the id of an active analyst key",
        ),
        ("mu: give mu or rho, not both", "--mu: give mu or rho, not both"),
        (
            "delta: must not exceed the dataset's delta_total (0.00001)",
            "--delta: must not exceed the dataset's delta_total (0.00001)",
        ),
        # A bare word is a quantity ("give epsilon"), left alone; a quoted field is the option.
        (
            "rho: this dataset's accounting is basic: give epsilon, delta",
            "--rho: this dataset's accounting is basic: give epsilon, delta",
        ),
        ('epsilon: give "epsilon" or "rho"', "--epsilon: give --epsilon or --rho"),
    ],
)
def test_grants_create_refusals_name_its_options(detail: str, expected: str) -> None:
    assert CLI_GRANT.respell(detail) == expected
