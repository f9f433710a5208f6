"""Tests of M4 ``exact_gapmax``: calibration, scoring, utility, no-result paths, privacy audit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms import exact_gapmax as mod
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.exact_gapmax import (
    MAX_SCORING_WORK,
    ExactGapMax,
    ExactGapMaxParams,
    candidate_sets,
    default_sample_rows,
    exact_gapmax,
    min_sample_rows,
    noise_bound,
    null_score,
    round_significant,
    scoring_work,
    strict_subspace_counts,
)
from service.mechanisms.noise import truncated_laplace_params
from tests.mechanisms.privacy_audit import audit

EPS, DELTA = 1.0, 1e-6


def subspace(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((d, k)))[0]


def in_subspace(n: int, basis: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((n, basis.shape[1])) @ basis.T


def projector_error(a: np.ndarray, b: np.ndarray) -> float:
    # ||P - P'||_2 directly: the sine formula loses accuracy below ~1e-8.
    return float(np.linalg.norm(a @ a.T - b @ b.T, 2))


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def scores(rows: np.ndarray, k: int, tol: float = 1e-9) -> dict[int, np.ndarray]:
    z = unit(rows)
    groups = candidate_sets(z, k, tol)
    return {c: c - strict_subspace_counts(z, g, k, tol) for c, g in groups.items()}


# ---------------------------------------------------------------------------------------------
# Calibration


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-6), (0.3, 1e-9), (3.0, 1e-5)])
def test_truncated_laplace_and_null_score(eps: float, delta: float) -> None:
    lam, bound = truncated_laplace_params(2.0, eps, delta)
    assert lam == pytest.approx(2.0 / eps)
    assert bound == pytest.approx((2.0 / eps) * math.log(1 + (math.exp(eps) - 1) / (2 * delta)))
    assert noise_bound(eps, delta) == bound
    assert null_score(3, eps, delta) == pytest.approx(3 + 4 * math.log(1 / delta) / eps + 1)


@pytest.mark.parametrize(
    ("robust", "eps", "delta"), [(1, 1.0, 1e-6), (0, 0.5, 1e-8), (4, 3.0, 1e-6)]
)
def test_min_sample_rows_is_lemma_3_5_sharpened(robust: int, eps: float, delta: float) -> None:
    l = robust  # noqa: E741 (the paper's name)
    n_min = min_sample_rows(l, eps, delta)
    assert n_min >= 3 * l + 8 * math.log(1 / delta) / eps + 2  # Lemma 3.5
    # The true subspace's gap at n_min clears 2A (sure release); one row fewer may not.
    a = noise_bound(eps, delta)
    assert (n_min - 2 * l) - null_score(l, eps, delta) - 1 > 2 * a
    if n_min - 1 >= 3 * l + 8 * math.log(1 / delta) / eps + 2:
        assert (n_min - 1 - 2 * l) - null_score(l, eps, delta) - 1 <= 2 * a


def test_min_sample_rows_value() -> None:
    assert min_sample_rows(1, 1.0, 1e-6) == 116  # ceil(3 + 8 ln(1e6) + 2) = 116


@pytest.mark.parametrize(
    ("n", "k", "d"), [(400, 2, 10), (20000, 2, 10), (20000, 3, 10), (5000, 2, 1000)]
)
def test_default_sample_rows_is_largest_within_cap(n: int, k: int, d: int) -> None:
    n0 = default_sample_rows(n, k, d)
    assert n0 <= n
    assert scoring_work(n0, k, d) <= MAX_SCORING_WORK
    if n0 < n:
        assert scoring_work(n0 + 1, k, d) > MAX_SCORING_WORK


def test_round_significant() -> None:
    values = np.array([0.123456789012345, -9.87654321098765e-5, 0.0, 1.0])
    rounded = round_significant(values)
    assert rounded[0] == 0.123456789012
    assert rounded[1] == -9.87654321099e-5
    assert rounded[2] == 0.0 and rounded[3] == 1.0
    np.testing.assert_array_equal(round_significant(rounded), rounded)


# ---------------------------------------------------------------------------------------------
# Scoring and deduplication


def test_scores_general_position_are_one() -> None:
    rows = np.random.default_rng(0).standard_normal((12, 3))
    got = scores(rows, 2)
    assert list(got) == [2] and got[2].shape == (66,)  # C(12, 2) distinct planes, 2 points each
    assert np.all(got[2] == 1)


def test_scores_plane_with_collinear_points_and_outlier() -> None:
    rng = np.random.default_rng(1)
    plane = subspace(4, 2, rng)
    rows = in_subspace(10, plane, rng)
    rows[:3] = rng.standard_normal((3, 1)) * rows[0]  # three points on one line
    rows = np.vstack([rows, rng.standard_normal((1, 4))])  # one outlier
    got = scores(rows, 2)
    # The plane is one candidate (deduplicated across its C(10, 2) - 3 spanning pairs): 10
    # members minus the 3 on the line. The outlier spans 7 planes with one other point each
    # and one plane with the line (4 members, 3 of them on the line).
    assert got[10].tolist() == [7]
    assert got[2].shape == (7,) and np.all(got[2] == 1)
    assert got[4].tolist() == [1]


def test_dedup_is_by_subspace_not_index_set() -> None:
    rng = np.random.default_rng(2)
    rows = in_subspace(30, subspace(6, 3, rng), rng)
    groups = candidate_sets(unit(rows), 3, 1e-9)
    assert list(groups) == [30] and groups[30].shape == (1, 30)


def test_scale_and_zero_rows() -> None:
    rng = np.random.default_rng(3)
    plane = subspace(5, 2, rng)
    rows = in_subspace(130, plane, rng) * rng.uniform(1e-3, 1e3, size=(130, 1))
    rows[:5] = 0.0
    basis, _ = exact_gapmax(rows, 2, EPS, DELTA, 1, 1e-9, 130, rng)
    assert basis is not None and projector_error(basis, plane) < 1e-9


# ---------------------------------------------------------------------------------------------
# Utility


def test_recovers_exact_subspace_done_when() -> None:
    """The issue's scenario: 400 points in a 2-dim subspace of R^10, eps = 1, delta = 1e-6."""
    rng = np.random.default_rng(4)
    plane = subspace(10, 2, rng)
    data = in_subspace(400, plane, rng)
    mech = ExactGapMax()
    params = mech.prepare(PublicContext(400, 10, None), 2, EPS, DELTA, ExactGapMaxParams())
    assert params.sample_rows == 400 and params.robustness == 1
    out = mech.run(data, ReleaseSpec(2, EPS, DELTA, params), rng)
    assert out.basis is not None and out.no_result_reason is None
    assert projector_error(out.basis, plane) < 1e-6
    np.testing.assert_allclose(out.basis.T @ out.basis, np.eye(2), atol=1e-10)
    np.testing.assert_array_equal(round_significant(out.basis), out.basis)


def test_recovers_with_outliers_and_k3() -> None:
    rng = np.random.default_rng(5)
    space = subspace(8, 3, rng)
    data = np.vstack([in_subspace(150, space, rng), rng.standard_normal((3, 8))])
    rng.shuffle(data)
    basis, _ = exact_gapmax(data, 3, EPS, DELTA, 3, 1e-9, 153, rng)
    assert basis is not None and projector_error(basis, space) < 1e-6


def test_subsampling_recovers() -> None:
    rng = np.random.default_rng(6)
    plane = subspace(10, 2, rng)
    data = in_subspace(3000, plane, rng)
    basis, info = exact_gapmax(data, 2, EPS, DELTA, 1, 1e-9, 200, rng)
    assert info["sample_rows"] == 200
    assert basis is not None and projector_error(basis, plane) < 1e-6


def test_basis_is_rotated_at_random_inside_the_subspace() -> None:
    """The released basis is Haar within s: its first column is not tied to the data points."""
    rng = np.random.default_rng(7)
    plane = subspace(6, 2, rng)
    data = in_subspace(150, plane, rng)
    firsts = []
    for _ in range(20):
        basis, _ = exact_gapmax(data, 2, EPS, DELTA, 1, 1e-9, 150, rng)
        assert basis is not None
        firsts.append(plane.T @ basis[:, 0])
    angles = np.arctan2(*np.array(firsts).T)
    assert np.ptp(np.mod(angles, np.pi)) > 1.0  # spread over the circle, not one fixed basis


# ---------------------------------------------------------------------------------------------
# No-result paths and refusals


def test_general_position_gives_no_result() -> None:
    rng = np.random.default_rng(8)
    data = rng.standard_normal((400, 10))
    mech = ExactGapMax()
    params = mech.prepare(PublicContext(400, 10, None), 2, EPS, DELTA, ExactGapMaxParams())
    out = mech.run(data, ReleaseSpec(2, EPS, DELTA, params), rng)
    assert out.basis is None and out.no_result_reason is not None


def test_two_equally_heavy_subspaces_give_no_result() -> None:
    """Zero gap: the release rule (noisy gap > A) returns NULL rather than a random candidate."""
    rng = np.random.default_rng(9)
    data = np.vstack(
        [in_subspace(130, subspace(10, 2, rng), rng), in_subspace(130, subspace(10, 2, rng), rng)]
    )
    for _ in range(2):
        basis, _ = exact_gapmax(data, 2, EPS, DELTA, 1, 1e-9, 260, rng)
        assert basis is None


def test_too_few_points_in_subspace_gives_no_result() -> None:
    rng = np.random.default_rng(10)
    data = np.vstack([in_subspace(40, subspace(10, 2, rng), rng), rng.standard_normal((160, 10))])
    basis, _ = exact_gapmax(data, 2, EPS, DELTA, 1, 1e-9, 200, rng)
    assert basis is None


def test_refuses_small_n() -> None:
    with pytest.raises(InvalidParameter) as err:
        ExactGapMax().prepare(PublicContext(100, 10, None), 2, EPS, DELTA, ExactGapMaxParams())
    assert err.value.field == "n_rows" and "short by 16" in err.value.message


def test_refuses_when_compute_cap_is_below_lemma_bound() -> None:
    with pytest.raises(InvalidParameter) as err:
        ExactGapMax().prepare(
            PublicContext(100_000, 1000, None), 5, EPS, DELTA, ExactGapMaxParams()
        )
    assert err.value.field == "k" and "compute cap" in err.value.message
    assert "short by" in err.value.message


def test_refuses_bad_sample_rows() -> None:
    mech, ctx = ExactGapMax(), PublicContext(1000, 10, None)
    for n0, words in [(1001, "more than"), (100, "short by 16"), (1000, "compute cap")]:
        with pytest.raises(InvalidParameter) as err:
            mech.prepare(ctx, 2, EPS, DELTA, ExactGapMaxParams(sample_rows=n0))
        assert err.value.field == "sample_rows" and words in err.value.message
    with pytest.raises(InvalidParameter):
        mech.prepare(ctx, 2, EPS, 0.0, ExactGapMaxParams())


# ---------------------------------------------------------------------------------------------
# Empirical privacy audit


def boundary_pair(n_in: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """``n_in`` points in a plane vs the same with one of them replaced by an outlier.

    ``u(s)`` drops by one; ``n_in`` is chosen so the gap sits at the release threshold ``A``,
    where the release event is most sensitive.
    """
    rng = np.random.default_rng(seed)
    data = in_subspace(n_in, subspace(4, 2, rng), rng)
    neighbour = data.copy()
    neighbour[0] = rng.standard_normal(4)
    return data, neighbour


def released(out: tuple[np.ndarray | None, dict[str, object]]) -> bool:
    return out[0] is not None


def run_audit(n_in: int, runs: int) -> float:
    data, neighbour = boundary_pair(n_in)

    def mechanism(
        x: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray | None, dict[str, object]]:
        return exact_gapmax(x, 2, EPS, DELTA, 1, 1e-9, x.shape[0], rng)

    return audit(mechanism, data, neighbour, released, runs, DELTA, seed=12).eps_lower_bound


def threshold_n_in() -> int:
    # u(s) = n_in - 1 (no three points on a line); gap = u(s) - u(NULL) - 1 is released when
    # gap + xi > A: put the gap just above A.
    return math.ceil(null_score(1, EPS, DELTA) + 2 + noise_bound(EPS, DELTA))


def test_audit_short() -> None:
    assert run_audit(threshold_n_in(), 150) <= EPS


@pytest.mark.slow
def test_audit_long() -> None:
    assert run_audit(threshold_n_in(), 2000) <= EPS


def test_audit_negative_control(monkeypatch: pytest.MonkeyPatch) -> None:
    # The boundary moves with the noise: the pair sits at the weakened mechanism's threshold.
    n_in = math.ceil(null_score(1, EPS, DELTA) + 2 + noise_bound(EPS, DELTA) / 10)
    real = mod.truncated_laplace_params

    def tenth(*args: float) -> tuple[float, float]:
        lam, bound = real(*args)
        return lam / 10, bound / 10

    monkeypatch.setattr(mod, "truncated_laplace_params", tenth)
    assert run_audit(n_in, 150) > EPS


@pytest.mark.xfail(
    strict=True,
    reason=(
        "known limitation (docs/mechanisms.md, exact_gapmax): membership within tol is not "
        "sensitivity-1; one row moved by less than tol off the subspace can span a "
        "near-duplicate candidate that erases the gap, so the guarantee holds only in exact "
        "arithmetic"
    ),
)
def test_neighbours_within_the_tolerance_keep_the_release_probability():
    rng = np.random.default_rng(0)
    d, k, n, epsilon, delta = 4, 2, 40, 2.0, 1e-3
    basis, _ = np.linalg.qr(rng.normal(size=(d, k)))
    exact = rng.normal(size=(n, k)) @ basis.T
    normal_plane = np.linalg.qr(np.c_[basis, rng.normal(size=(d, 2))])[0][:, 2:]
    tilted = exact.copy()
    tilt = rng.uniform(1e-10, 9.9e-10)
    direction = normal_plane @ rng.normal(size=2)
    tilted[0] += tilt * np.linalg.norm(exact[0]) * direction / np.linalg.norm(direction)

    def released(data: np.ndarray) -> int:
        return sum(
            exact_gapmax(data, k, epsilon, delta, 1, 1e-9, n, np.random.default_rng(seed))[0]
            is not None
            for seed in range(20)
        )

    on_exact, on_tilted = released(exact), released(tilted)
    assert on_exact == 20
    # (eps, delta)-DP: P[release | X'] >= e^-eps (P[release | X] - delta) ~ 0.135.
    assert on_tilted / 20 >= np.exp(-epsilon) * (on_exact / 20 - delta)
