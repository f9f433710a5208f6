"""Tests of service/mechanisms/linalg.py."""

from __future__ import annotations

import warnings
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from service.mechanisms import linalg
from service.mechanisms.linalg import (
    _clip_rows,
    clip_rows,
    clipped_gram,
    eigenvalues_desc,
    iter_row_chunks,
    orthonormal_basis,
    power_of_two_exponent,
    projector,
    subspace_distance,
    top_k_eigh,
    top_right_singular_vectors,
)


def test_clip_rows_scales_only_long_rows() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((200, 5)) * rng.uniform(0, 3, size=(200, 1))
    rows[0] = 0.0
    clipped = clip_rows(rows, 1.5)
    norms = np.linalg.norm(rows, axis=1)
    clipped_norms = np.linalg.norm(clipped, axis=1)
    assert np.all(clipped_norms <= 1.5 + 1e-12)
    short = norms <= 1.5
    assert np.array_equal(clipped[short], rows[short])
    assert clipped_norms[~short] == pytest.approx(np.full((~short).sum(), 1.5))
    # Directions are kept: x_i <- x_i * min(1, C/||x_i||).
    cosines = np.sum(clipped[~short] * rows[~short], axis=1) / (clipped_norms * norms)[~short]
    assert cosines == pytest.approx(np.ones((~short).sum()))
    assert np.array_equal(clipped[0], np.zeros(5))


def previous_clip_rows(rows: np.ndarray, clip_norm: float) -> np.ndarray:
    """clip_rows as it was before the einsum fast path (every row scaled, always a copy)."""
    block = np.asarray(rows, dtype=np.float64)
    exponent = power_of_two_exponent(np.max(np.abs(block), axis=1))
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(block, -exponent[:, None])
        norms = np.linalg.norm(scaled, axis=1)
        limit = np.ldexp(clip_norm, -exponent)
    keep = norms <= limit
    factor = np.where(keep, 0.0, clip_norm / np.where(keep, 1.0, norms))
    scaled *= factor[:, None]
    return np.asarray(np.where(keep[:, None], block, scaled))


def mixed_scale_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Rows of norms spread around 1, plus rows at extreme scales and zero rows."""
    rows = rng.standard_normal((n, d)) * rng.uniform(0.0, 2.0, size=(n, 1))
    scales = 10.0 ** rng.choice([-300.0, -200.0, -150.0, -100.0, 100.0, 150.0, 200.0, 300.0], n)
    extreme = rng.random(n) < 0.2
    rows[extreme] *= scales[extreme, None]
    rows[rng.random(n) < 0.05] = 0.0
    return rows


@pytest.mark.parametrize("clip_norm", [1e-200, 1e-3, 1.0, 2.5, 1e100, 1e200])
def test_clip_rows_equals_the_previous_implementation(clip_norm: float) -> None:
    # The fast path only changes which norm decides (sqrt of an einsum instead of the scaled
    # norm); kept rows are the input and clipped rows the same formula, so the outputs agree
    # bit for bit except for a row whose norm is within rounding of C (none here).
    rng = np.random.default_rng(2)
    rows = mixed_scale_rows(rng, 2000, 7)
    expected = previous_clip_rows(rows, clip_norm)
    got = clip_rows(rows, clip_norm)
    assert got is not rows and np.array_equal(got, expected)
    assert np.any(np.all(got == rows, axis=1)) or clip_norm < 1e-100  # some rows kept
    assert clip_norm > 1e150 or np.any(np.any(got != rows, axis=1))  # and some clipped
    # Few rows over C (gathered) and most rows over C (whole-block arithmetic): same bits.
    for fraction in (0.05, 0.9):
        near = rng.standard_normal((2000, 7)) * (0.1 * clip_norm)  # norms ~0.26 C
        near[rng.random(2000) < fraction] *= 100.0  # norms ~26 C
        assert np.array_equal(clip_rows(near, clip_norm), previous_clip_rows(near, clip_norm))


def test_clipped_gram_skips_the_copy_and_equals_the_previous_gram(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    inside = rng.standard_normal((500, 9)) * 0.2  # every row below C = 3
    assert _clip_rows(inside, 3.0) is inside  # no copy
    some_over = inside.copy()
    some_over[::50] *= 100.0
    for data in (inside, some_over, mixed_scale_rows(rng, 500, 9)):
        path = tmp_path / "data.npy"
        np.save(path, data)
        mapped = np.load(path, mmap_mode="r")
        for chunk_rows in (1, 64, 10_000):
            expected = np.zeros((9, 9))
            with np.errstate(under="ignore", over="ignore"):
                for start in range(0, 500, chunk_rows):
                    block = previous_clip_rows(data[start : start + chunk_rows], 3.0)
                    expected += block.T @ block
            assert np.array_equal(clipped_gram(mapped, 3.0, chunk_rows=chunk_rows), expected)


def test_iter_row_chunks_covers_every_row_once() -> None:
    data = np.arange(23 * 3, dtype=np.float64).reshape(23, 3)
    chunks = list(iter_row_chunks(data, 5))
    assert [len(c) for c in chunks] == [5, 5, 5, 5, 3]
    assert np.array_equal(np.concatenate(chunks), data)


def test_read_ahead_hints_the_right_file_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint covers exactly the chunk's rows in the file (a view's offset included); a
    non-mapped or strided array gets no hint; the chunks are the same either way."""
    data = np.arange(40 * 3, dtype=np.float64).reshape(40, 3)
    path = tmp_path / "data.npy"
    np.save(path, data)
    mapped = np.load(path, mmap_mode="r")
    hints: list[tuple[int, int]] = []
    real = linalg.os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        hints.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(linalg.os, "posix_fadvise", record)
    view = mapped[10:]
    chunks = list(iter_row_chunks(view, 8))
    assert np.array_equal(np.concatenate(chunks), data[10:])
    header = mapped.offset
    rows = [(offset - header) // 24 for offset, _ in hints]
    assert rows == [10, 18, 26, 34]  # the first chunk, then one ahead of each chunk read
    raw = path.read_bytes()
    for offset, length in hints:
        first = (offset - header) // 24
        expected = data[first : first + length // 24].tobytes()
        assert raw[offset : offset + length] == expected
    hints.clear()
    list(iter_row_chunks(data, 8))
    list(iter_row_chunks(mapped[:, :2], 8))
    assert hints == []


@pytest.mark.parametrize("chunk_rows", [1, 7, 100, 10_000])
def test_clipped_gram_equals_gram_of_clipped_rows(chunk_rows: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = rng.standard_normal((301, 6)) * 2
    path = tmp_path / "data.npy"
    np.save(path, data)
    mapped = np.load(path, mmap_mode="r")
    expected = clip_rows(data, 1.0).T @ clip_rows(data, 1.0)
    assert clipped_gram(mapped, 1.0, chunk_rows=chunk_rows) == pytest.approx(expected, abs=1e-10)


def test_top_k_eigh_and_eigenvalues_desc() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 8))
    sym = a + a.T
    values, vectors = top_k_eigh(sym, 3)
    ref_values, ref_vectors = np.linalg.eigh(sym)
    assert values == pytest.approx(ref_values[::-1][:3])
    assert vectors.shape == (8, 3)
    assert sym @ vectors == pytest.approx(vectors * values, abs=1e-10)
    assert eigenvalues_desc(sym) == pytest.approx(ref_values[::-1])
    # subspace_distance computes sqrt(1 - s^2), which loses half the digits.
    assert subspace_distance(vectors, ref_vectors[:, ::-1][:, :3]) < 1e-6


def test_orthonormal_basis_spans_the_columns() -> None:
    rng = np.random.default_rng(3)
    m = rng.standard_normal((10, 3))
    q = orthonormal_basis(m)
    assert q.T @ q == pytest.approx(np.eye(3), abs=1e-12)
    assert projector(q) @ m == pytest.approx(m, abs=1e-12)


def test_top_right_singular_vectors() -> None:
    rng = np.random.default_rng(4)
    m = rng.standard_normal((30, 6)) @ np.diag([10, 5, 3, 1, 0.5, 0.1])
    v = top_right_singular_vectors(m, 2)
    _, _, vt = np.linalg.svd(m)
    assert subspace_distance(v, vt[:2].T) < 1e-6
    assert v.T @ v == pytest.approx(np.eye(2), abs=1e-12)


def test_projector_is_an_orthogonal_projection() -> None:
    q = orthonormal_basis(np.random.default_rng(5).standard_normal((7, 2)))
    p = projector(q)
    assert p @ p == pytest.approx(p, abs=1e-12)
    assert p == pytest.approx(p.T)
    assert np.trace(p) == pytest.approx(2.0)


def test_subspace_distance_is_the_spectral_norm_of_projector_difference() -> None:
    rng = np.random.default_rng(6)
    for _ in range(20):
        a = orthonormal_basis(rng.standard_normal((6, 2)))
        b = orthonormal_basis(rng.standard_normal((6, 2)))
        expected = np.linalg.norm(projector(a) - projector(b), 2)
        assert subspace_distance(a, b) == pytest.approx(expected, abs=1e-9)
        assert subspace_distance(a, b) == pytest.approx(subspace_distance(b, a), abs=1e-12)


def test_subspace_distance_extremes_and_shape_check() -> None:
    rng = np.random.default_rng(7)
    a = orthonormal_basis(rng.standard_normal((5, 2)))
    rotation = np.array([[0.6, -0.8], [0.8, 0.6]])
    assert subspace_distance(a, a @ rotation) < 1e-7
    e = np.eye(4)
    assert subspace_distance(e[:, :2], e[:, 2:]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        subspace_distance(e[:, :2], e[:, :3])


# ---------------------------------------------------------------------------------------------
# Totality: right at every finite scale, never raising


def _exact_norm(row: list[float]) -> Decimal:
    """``||x||`` to 60 digits: decimal arithmetic has no overflow or underflow at any float."""
    with localcontext() as context:
        context.prec = 60
        return sum((Decimal(value) ** 2 for value in row), Decimal(0)).sqrt()


def reference_clip(row: np.ndarray, clip: float) -> np.ndarray:
    """``x min(1, C/||x||)`` in 60-digit decimal arithmetic, each entry rounded once to float
    (``math.hypot`` scales internally but still overflows on norms above the largest float:
    ``[5, 10, 10, 10] 1e307`` has norm ``1.8e308``)."""
    values = row.tolist()
    norm = _exact_norm(values)
    if norm <= Decimal(clip):
        return row.copy()
    with localcontext() as context:
        context.prec = 60
        return np.array([float(Decimal(value) * Decimal(clip) / norm) for value in values])


@settings(max_examples=300, deadline=None)
@given(
    mantissas=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=6),
    exponent=st.integers(-307, 307),
    clip=st.one_of(
        st.builds(lambda e: 1.5 * 10.0**e, st.integers(-150, 150)),
        # Any positive finite C, the subnormal and the largest floats among them.
        st.floats(min_value=5e-324, max_value=1.7976931348623157e308),
    ),
)
@example(mantissas=[5.0, 10.0, 10.0, 10.0], exponent=307, clip=1.5)
@example(mantissas=[5.0, 10.0, 10.0, 10.0], exponent=307, clip=1.7976931348623157e308)
@example(mantissas=[10.0, 10.0], exponent=307, clip=1.7976931348623157e308)
@example(mantissas=[8.98846567431158], exponent=307, clip=8.98846567431157e307)
@example(mantissas=[1.0, 1.0], exponent=-307, clip=5e-324)
def test_clip_rows_is_right_at_every_finite_scale(
    mantissas: list[float], exponent: int, clip: float
) -> None:
    row = np.array(mantissas) * 10.0**exponent
    assume(np.all(np.isfinite(row)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # total and silent: no RuntimeWarning at any scale
        got = clip_rows(row[None, :], clip)[0]
    expected = reference_clip(row, clip)
    assert np.all(np.isfinite(got))
    # Relative precision per entry, except where an entry (or an intermediate of either
    # computation) is subnormal: there the absolute error is allowed up to 1e-15 of the row's
    # norm, far below anything a Gram matrix of the clipped rows can resolve.
    slack = max(1e-321, 1e-15 * float(_exact_norm(expected.tolist())))
    assert got == pytest.approx(expected, rel=1e-12, abs=slack)
    bound = Decimal(clip) * Decimal("1.000000000001") + Decimal("1e-321")
    assert _exact_norm(got.tolist()) <= bound


def test_clip_rows_examples_the_old_norm_got_wrong() -> None:
    # np.linalg.norm of the first row is inf (so it was zeroed), of the second 0 (so it was
    # scaled by C / tiny and zeroed as well).
    rows = np.array([[3e200, 4e200], [3e-300, 4e-300], [0.0, 0.0]])
    clipped = clip_rows(rows, 1e-300)
    assert clipped[0] == pytest.approx([6e-301, 8e-301], rel=1e-14)
    assert clipped[1] == pytest.approx([6e-301, 8e-301], rel=1e-14)
    assert np.array_equal(clipped[2], [0.0, 0.0])
    assert clip_rows(rows, 1.0)[0] == pytest.approx([0.6, 0.8], rel=1e-15)


def test_eigensolvers_scale_by_powers_of_two() -> None:
    rng = np.random.default_rng(8)
    a = rng.standard_normal((5, 5))
    sym = a + a.T
    for scale in (1e-300, 1e300, 1.5e307):
        values, vectors = top_k_eigh(sym * scale, 2)
        ref_values, _ = top_k_eigh(sym, 2)
        assert values == pytest.approx(ref_values * scale, rel=1e-12)
        assert vectors.T @ vectors == pytest.approx(np.eye(2), abs=1e-12)
        assert eigenvalues_desc(sym * scale) == pytest.approx(eigenvalues_desc(sym) * scale)
        q = orthonormal_basis(a[:, :2] * scale)
        assert q.T @ q == pytest.approx(np.eye(2), abs=1e-12)
        v = top_right_singular_vectors(a * scale, 2)
        assert v.T @ v == pytest.approx(np.eye(2), abs=1e-12)


def test_public_fallbacks_when_lapack_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise np.linalg.LinAlgError("did not converge")

    monkeypatch.setattr(linalg.scipy.linalg, "eigh", fail)
    monkeypatch.setattr(linalg.scipy.linalg, "eigvalsh", fail)
    monkeypatch.setattr(linalg.scipy.linalg, "svd", fail)
    monkeypatch.setattr(linalg.np.linalg, "qr", fail)
    sym = np.diag([3.0, 2.0, 1.0])
    values, vectors = top_k_eigh(sym, 2)
    assert np.array_equal(values, [0.0, 0.0]) and np.array_equal(vectors, np.eye(3, 2))
    assert np.array_equal(eigenvalues_desc(sym), np.zeros(3))
    assert np.array_equal(orthonormal_basis(sym[:, :2]), np.eye(3, 2))
    assert np.array_equal(top_right_singular_vectors(sym, 2), np.eye(3, 2))


def test_second_driver_before_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    real = linalg.scipy.linalg.eigh
    calls: list[str] = []

    def first_fails(*args: object, **kwargs: object) -> object:
        calls.append(str(kwargs.get("driver", "evr")))
        if "subset_by_index" in kwargs:
            raise np.linalg.LinAlgError("did not converge")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(linalg.scipy.linalg, "eigh", first_fails)
    values, _ = top_k_eigh(np.diag([3.0, 2.0, 1.0]), 2)
    assert values == pytest.approx([3.0, 2.0]) and calls == ["evr", "evd"]


def test_non_finite_input_gets_the_fallback_not_an_exception() -> None:
    bad = np.array([[np.inf, 0.0], [0.0, 1.0]])
    assert np.array_equal(top_k_eigh(bad, 1)[1], np.eye(2, 1))
    assert np.array_equal(eigenvalues_desc(bad), np.zeros(2))
    assert np.array_equal(orthonormal_basis(bad), np.eye(2))
