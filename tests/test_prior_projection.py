"""The prior layer (service.prior_projection): rows projected without growing or overflowing,
bases lifted orthonormal into the prior's span, any mechanism wrapped at m columns, total on
extreme finite rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism
from service.prior_projection import (
    MAX_PROJECTED_NORM,
    contraction,
    lift_basis,
    on_prior,
    project_rows,
)

D, M = 9, 4


def basis(seed: int, d: int = D, m: int = M) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, m)))
    return q


def test_projection_never_lengthens_a_row_at_any_magnitude() -> None:
    prior = basis(0)
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(50, D))
    rows[:10] *= 1e299  # norms about 3e299: below the cap
    rows[10:20] *= 1e-300
    rows[20:25] = 0.0
    projected = project_rows(rows, prior, chunk_rows=7)
    assert projected.shape == (50, M) and np.all(np.isfinite(projected))
    # Exactly X P where that is representable (relative rounding only).
    scale = np.max(np.abs(rows), axis=1, keepdims=True)
    scale[scale == 0] = 1
    np.testing.assert_allclose(projected / scale, (rows / scale) @ prior, rtol=1e-12, atol=1e-15)
    ratio = np.linalg.norm(projected[25:], axis=1) / np.linalg.norm(rows[25:], axis=1)
    assert np.all(ratio <= 1 + 1e-12)
    np.testing.assert_array_equal(projected[20:25], 0.0)


def test_a_projection_past_the_largest_double_is_capped_along_its_direction() -> None:
    prior = np.eye(D)[:, :M]
    rows = np.full((2, D), 1.5e308)
    projected = project_rows(rows, prior)
    # Each entry 1.5e308 is finite, but the row's norm (3e308) is not: capped.
    np.testing.assert_allclose(projected / MAX_PROJECTED_NORM, np.full((2, M), 0.5))


def test_contraction_brings_the_largest_singular_value_to_one() -> None:
    prior = basis(2) * (1 + 1e-7)
    assert np.linalg.norm(contraction(prior), 2) <= 1.0
    exact = basis(3)
    if np.linalg.norm(exact, 2) <= 1.0:
        assert contraction(exact) is exact


def test_lifted_bases_are_orthonormal_and_inside_the_span() -> None:
    prior = basis(4)
    inner, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(M, 2)))
    lifted = lift_basis(prior, inner)
    np.testing.assert_allclose(lifted.T @ lifted, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(lifted, prior @ inner, atol=1e-12)


def test_the_wrapper_prepares_previews_and_sizes_at_m_columns() -> None:
    inner = get_mechanism("analyze_gauss")
    assert inner is not None
    wrapped = on_prior(inner, basis(6), "ab" * 32)
    assert wrapped.name == "analyze_gauss" and wrapped.accountings == inner.accountings
    ctx = PublicContext(n_rows=500, n_cols=D, row_norm_bound=1.0)
    params = wrapped.prepare(ctx, 2, 1.0, 1e-6, wrapped.parse_params({}))
    spec = ReleaseSpec(2, 1.0, 1e-6, params)
    inside = PublicContext(n_rows=500, n_cols=M, row_norm_bound=1.0)
    assert wrapped.privacy_steps(ctx, spec) == inner.privacy_steps(inside, spec)
    shown = wrapped.preview(ctx, spec)
    assert shown.scales["prior_dimension"] == M
    assert shown.scales["sigma"] == inner.preview(inside, spec).scales["sigma"]
    assert wrapped.memory_bytes(ctx, spec) >= inner.memory_bytes(inside, spec) + 8 * 500 * M
    # k above m is refused by the inner mechanism's own check, at m columns.
    with pytest.raises(ValueError, match=str(M)):
        wrapped.prepare(ctx, M + 1, 1.0, 1e-6, wrapped.parse_params({}))


@pytest.mark.parametrize("magnitude", [1e-300, 1.0, 1e300])
@pytest.mark.parametrize("mechanism_name", ["analyze_gauss", "auto"])
def test_wrapped_mechanisms_are_total_on_extreme_rows(
    magnitude: float, mechanism_name: str
) -> None:
    inner = get_mechanism(mechanism_name)
    assert inner is not None
    prior = basis(7)
    wrapped = on_prior(inner, prior, "cd" * 32)
    rng = np.random.default_rng(8)
    rows = rng.normal(size=(300, D)) * magnitude
    rows[:20] = rows[20]  # duplicates
    rows[20:30] = 0.0
    ctx = PublicContext(n_rows=300, n_cols=D, row_norm_bound=1.0)
    raw = {"center": "private"}
    params = wrapped.prepare(ctx, 2, 1.0, 1e-6, wrapped.parse_params(raw))
    out = wrapped.run(rows, ReleaseSpec(2, 1.0, 1e-6, params), np.random.default_rng(9))
    if out.basis is not None:
        assert out.basis.shape == (D, 2) and np.all(np.isfinite(out.basis))
        assert np.linalg.norm(out.basis - prior @ (prior.T @ out.basis)) < 1e-9
    else:
        assert out.no_result_reason
    assert out.extras["prior"]["dimension"] == M


def test_a_prior_with_near_parallel_columns_inside_the_tolerance_lengthens_no_clipped_row() -> None:
    """Columns tilted towards each other by just under the tolerance (``max |P^T P - I|`` 0.99e-6
    at m = 64: largest singular value 1 + 3.1e-5, so ``x P`` could be 3.1e-5 longer than ``x``)
    pass the check. The wrapper divides ``P`` by its largest singular value, and what rounding
    leaves (measured: at most 4.4e-16 over unit rows) is removed by the mechanism's own clip, so
    every row the Gram matrix sees has norm at most C."""
    from service.mechanisms.linalg import clip_rows
    from service.priors import check_matrix

    rng = np.random.default_rng(7)
    d, m = 200, 64
    q, _ = np.linalg.qr(rng.normal(size=(d, m)))
    tilt = np.full((m, m), 0.99e-6 / 2)
    np.fill_diagonal(tilt, 0.0)
    prior = check_matrix(q @ (np.eye(m) + tilt), "file")
    assert np.linalg.norm(prior, 2) > 1 + 3e-5
    shrunk = contraction(prior)
    top = np.linalg.svd(shrunk)[0][:, :3].T
    rows = np.vstack([top, rng.normal(size=(500, d))])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    projected = project_rows(rows, shrunk)
    assert np.max(np.linalg.norm(projected, axis=1)) <= 1 + 1e-15
    clipped = clip_rows(projected, 1.0)
    assert np.max(np.linalg.norm(clipped, axis=1)) <= 1 + d * 2.0**-53


def test_a_prior_with_entries_near_the_largest_double_is_refused_silently() -> None:
    """Outside audit of issues 11/22: ``[[1e308, 0], [0, 1]]`` overflowed ``P^T P`` with a
    RuntimeWarning on the API's stderr before it was refused."""
    import warnings

    from service.prior_projection import is_orthonormal

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert is_orthonormal(np.array([[1e308, 0.0], [0.0, 1.0]]), 1e-6) == (False, math.inf)
        assert is_orthonormal(np.array([[1e308], [1e308]]), 1e-6) == (False, math.inf)
