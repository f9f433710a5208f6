"""Tests of service/mechanisms/linalg.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.mechanisms.linalg import (
    clip_rows,
    clipped_gram,
    eigenvalues_desc,
    iter_row_chunks,
    orthonormal_basis,
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


def test_iter_row_chunks_covers_every_row_once() -> None:
    data = np.arange(23 * 3, dtype=np.float64).reshape(23, 3)
    chunks = list(iter_row_chunks(data, 5))
    assert [len(c) for c in chunks] == [5, 5, 5, 5, 3]
    assert np.array_equal(np.concatenate(chunks), data)


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
