"""Totality with the params and shapes tests/mechanisms/test_totality.py runs without: every
registered mechanism with a private, public or no centre, a clip quantile or none, ``k`` up to
``d``, ``d`` far above ``n``, and inside a public prior (``m`` from 1 to ``d``, columns off
orthonormal by up to the accepted tolerance, subnormal entries), on the same adversarial finite
matrices (1e-300..1.7e308, zero, duplicate and subnormal rows).

Each run returns a MechanismOutput (a result or a charged no_result) or is refused at prepare
from public facts; a basis is finite and orthonormal, and every stated figure finite (extras
go into the store as JSON) with shares and their intervals inside [0, 1].
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from service.mechanisms.base import (
    InvalidParameter,
    MechanismOutput,
    PublicContext,
    ReleaseSpec,
    clip_norm_range,
)
from service.mechanisms.registry import MECHANISMS
from service.prior_projection import on_prior
from service.priors import ORTHONORMAL_TOLERANCE
from tests.mechanisms.test_totality import BUDGETS, EXPONENTS, check_basis

EXTREMES = [1e300, -1e300, 1e-300, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324, -0.0]


@st.composite
def shapes_and_rows(draw: st.DrawFn) -> np.ndarray:
    """Rows as in test_totality, plus ``d`` far above ``n`` and whole-matrix constants."""
    wide = draw(st.booleans())
    n = draw(st.integers(1, 6 if wide else 40))
    d = draw(st.integers(6, 14) if wide else st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "constant", "one_row", "extremes"]))
    if kind == "constant":
        rows = np.full((n, d), draw(st.sampled_from([*EXTREMES, 0.0, 1.0])))
    elif kind == "one_row":
        rows = np.zeros((n, d))
        rows[rng.integers(0, n)] = rng.choice(EXTREMES, size=d)
    else:
        rows = rng.standard_normal((n, d))
        exps = np.array(draw(st.lists(st.sampled_from(EXPONENTS), min_size=n, max_size=n)))
        rows *= 10.0 ** exps[:, None]
        if kind == "extremes":
            mask = rng.random((n, d)) < 0.4
            rows[mask] = rng.choice(EXTREMES, size=int(mask.sum()))
    if draw(st.booleans()) and n > 1:
        rows[rng.integers(0, n, size=n // 2)] = rows[0]
    assert np.all(np.isfinite(rows))
    return rows


def centre_params(draw: st.DrawFn, d: int) -> dict[str, Any]:
    choice = draw(st.sampled_from(["none", "private", "public", "tiny_public"]))
    params: dict[str, Any] = {}
    if choice == "private":
        params["center"] = "private"
        params["center_share"] = draw(st.sampled_from([0.05, 0.2, 0.5]))
    elif choice == "public":
        params["center"] = [0.4 / math.sqrt(d)] * d
    elif choice == "tiny_public":
        params["center"] = [5e-324] * d
    quantile = draw(st.sampled_from([None, 0.05, 0.3, 0.9, "none"]))
    if quantile is not None:
        params["clip_quantile"] = quantile
    if draw(st.booleans()):
        params["center_route"] = draw(st.sampled_from(["auto", "mean", "pairs"]))
    return params


def fit(mechanism: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without the keys the mechanism's params do not name."""
    fields = set(mechanism.params_model.model_fields)
    return {key: value for key, value in raw.items() if key in fields}


def prior_matrix(draw: st.DrawFn, d: int, rng: np.random.Generator) -> np.ndarray:
    m = draw(st.integers(1, d))
    q = np.linalg.qr(rng.standard_normal((d, d)))[0][:, :m]
    how = draw(st.sampled_from(["exact", "tilted", "subnormal", "axis"]))
    if how == "tilted" and m >= 2:
        q[:, 1] += 0.49 * ORTHONORMAL_TOLERANCE * q[:, 0]
        q[:, 0] *= 1 + 0.24 * ORTHONORMAL_TOLERANCE
    elif how == "subnormal":
        q[np.abs(q) < 0.3] = 5e-324
        q /= np.linalg.norm(q, axis=0)
    elif how == "axis":
        q = np.eye(d)[:, :m]
    gram = q.T @ q
    assert np.max(np.abs(gram - np.eye(m))) <= ORTHONORMAL_TOLERANCE or how == "subnormal"
    return q


def check_output(out: MechanismOutput, d: int, k: int) -> None:
    check_basis(out, d, k)
    ratio = out.extras.get("explained_variance_ratio")
    if ratio is not None:
        assert all(0.0 <= share <= 1.0 for share in ratio), ratio
        assert sum(ratio) <= 1.0 + 1e-9, ratio
    interval = out.extras.get("explained_variance_ratio_interval")
    if interval is not None:
        low, high = interval
        assert 0.0 <= low <= high <= 1.0, interval


def run_one(
    name: str,
    data: np.ndarray,
    k: int,
    clip: float,
    raw: dict[str, Any],
    seed: int,
    prior: np.ndarray | None = None,
) -> str:
    mechanism = MECHANISMS[name]
    epsilon, delta, base = BUDGETS.get(name, (1.0, 1e-6, {}))
    n, d = data.shape
    if prior is not None:
        mechanism = on_prior(mechanism, prior, "0" * 64)
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=clip)
    try:
        params = mechanism.parse_params({**base, **fit(mechanism, raw)})
        params = mechanism.prepare(ctx, k, epsilon, delta, params)
    except InvalidParameter as refusal:
        return f"refused: {refusal.field}"
    except ValueError as refusal:  # pydantic: params that do not parse, a 422 over HTTP
        return f"unparsed: {type(refusal).__name__}"
    out = mechanism.run(data, ReleaseSpec(k, epsilon, delta, params), np.random.default_rng(seed))
    check_output(out, d, k)
    return "no_result" if out.no_result_reason else "ran"


FUZZ = settings(
    max_examples=int(os.environ.get("TOTALITY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
@FUZZ
@given(data=st.data(), rows=shapes_and_rows(), seed=st.integers(0, 2**32 - 1))
def test_every_mechanism_is_total_with_centring_clip_quantile_and_any_k(
    name: str, data: st.DataObject, rows: np.ndarray, seed: int
) -> None:
    d = rows.shape[1]
    k = data.draw(st.integers(1, min(d, 3)) | st.just(d))
    clip = data.draw(st.sampled_from([1.0, 1e-100, 1e100, 3.0e-7]))
    raw = centre_params(data.draw, d)
    event(run_one(name, rows, k, clip, raw, seed))


@pytest.mark.parametrize("name", sorted(MECHANISMS))
@FUZZ
@given(data=st.data(), rows=shapes_and_rows(), seed=st.integers(0, 2**32 - 1))
def test_every_mechanism_is_total_inside_a_prior(
    name: str, data: st.DataObject, rows: np.ndarray, seed: int
) -> None:
    d = rows.shape[1]
    prior = prior_matrix(data.draw, d, np.random.default_rng(seed))
    m = prior.shape[1]
    k = data.draw(st.integers(1, m))
    clip = data.draw(st.sampled_from([1.0, 1e100, 3.0e-7]))
    raw = centre_params(data.draw, m) if data.draw(st.booleans()) else {}
    event(run_one(name, rows, k, clip, raw, seed, prior=prior))


@pytest.mark.parametrize("name", sorted(MECHANISMS))
@FUZZ
@given(
    data=st.data(),
    rows=shapes_and_rows(),
    seed=st.integers(0, 2**32 - 1),
    epsilon=st.sampled_from([1e-30, 1e-6, 0.05, 1.0, 709.5, 1000.0]),
    delta=st.sampled_from([1e-30, 1e-6, 0.1, 0.9]),
    edge=st.sampled_from(["high", "low"]),
)
def test_every_mechanism_is_total_at_the_edges_of_the_accepted_clip_norms(
    name: str,
    data: st.DataObject,
    rows: np.ndarray,
    seed: int,
    epsilon: float,
    delta: float,
    edge: str,
) -> None:
    # The clip-scale check (base.check_clip_scale) admits C up to where C^2 times the largest
    # quantity the run computes reaches 2^960 (and down to 2^-969 for the smallest); a release
    # accepted there must still run. Epsilon and delta at the request's extremes set the
    # noise scales those multiples cover.
    mechanism = MECHANISMS[name]
    n, d = rows.shape
    k = data.draw(st.integers(1, d))
    raw = fit(mechanism, centre_params(data.draw, d))
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    try:
        params = mechanism.parse_params({**BUDGETS.get(name, (1.0, 1e-6, {}))[2], **raw})
        multiples = getattr(mechanism, "c2_multiples", None)
        if multiples is None:
            event("no clip")
            return
        low, high = multiples(ctx, k, epsilon, delta)
    except (InvalidParameter, ValueError) as refusal:
        event(f"refused: {type(refusal).__name__}")
        return
    c_min, c_max = clip_norm_range(low, high)
    clip = c_max * (1 - 1e-9) if edge == "high" else c_min * (1 + 1e-9)
    with np.errstate(over="ignore"):
        scaled = rows * (clip if data.draw(st.booleans()) else 1.0)
    if not np.all(np.isfinite(scaled)):
        scaled = rows
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=clip)
    try:
        params = mechanism.prepare(ctx, k, epsilon, delta, params)
    except InvalidParameter as refusal:
        event(f"refused at prepare: {refusal.field}")
        return
    out = mechanism.run(scaled, ReleaseSpec(k, epsilon, delta, params), np.random.default_rng(seed))
    check_output(out, d, k)
    event("no_result" if out.no_result_reason else "ran")
