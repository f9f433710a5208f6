"""The one data-access interface: a dataset by reference's heavy passes (clipped Gram, clipped
column sum, subset bases) on Dask's synchronous scheduler in process and on a LocalCluster of
worker processes give the same bits, and equal the array path up to summation order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.mechanisms.linalg import clipped_gram, clipped_sum, subspace_distance
from service.mechanisms.sample_aggregate import random_partition, subset_bases
from service.reference import ParquetRows, ReferenceFault, inspect
from tests.factories import near_subspace
from tests.reference.conftest import s3fs_for, write_parquet


def _settings(tmp_path: Path, endpoint: str, bucket: str, scheduler: str | None) -> Settings:
    return Settings(
        data_dir=tmp_path,
        reference_roots=f"s3://{bucket}",
        s3_endpoint_url=endpoint,
        dask_scheduler=scheduler,
    )


@pytest.fixture
def stored(s3_endpoint: str, bucket: str) -> tuple[np.ndarray[Any, Any], list[str]]:
    """600 x 6 rows (some beyond the clip norm) in two objects of 120-row row groups."""
    rows, _ = near_subspace(np.random.default_rng(3), 600, 6, 2, noise=0.05)
    rows[::7] *= 3.0
    fs = s3fs_for(s3_endpoint)
    names = write_parquet(fs, f"{bucket}/data/part-0.parquet", rows[:350], 120)
    write_parquet(fs, f"{bucket}/data/part-1.parquet", rows[350:], 120)
    return rows, names


def test_passes_equal_in_process_on_dask_and_on_the_array(
    tmp_path: Path,
    s3_endpoint: str,
    bucket: str,
    dask_scheduler: str,
    stored: tuple[np.ndarray[Any, Any], list[str]],
) -> None:
    rows, names = stored
    local = _settings(tmp_path, s3_endpoint, bucket, None)
    reference = inspect(f"s3://{bucket}/data/", names, local)
    assert reference.shape == (600, 6)
    assert len(reference.objects) == 2 and all(o["etag"] for o in reference.objects)
    in_process = ParquetRows(reference, local)
    on_dask = ParquetRows(reference, _settings(tmp_path, s3_endpoint, bucket, dask_scheduler))
    try:
        center = np.full(6, 0.1)
        for source in (in_process, on_dask):
            assert source.shape == (600, 6)
        gram_here = clipped_gram(in_process, 1.0, center=center)  # type: ignore[arg-type]
        gram_dask = clipped_gram(on_dask, 1.0, center=center)  # type: ignore[arg-type]
        np.testing.assert_array_equal(gram_here, gram_dask)  # same tasks, same order
        np.testing.assert_allclose(gram_here, clipped_gram(rows, 1.0, center=center), rtol=1e-12)
        sum_dask = clipped_sum(on_dask, 1.0)  # type: ignore[arg-type]
        np.testing.assert_array_equal(clipped_sum(in_process, 1.0), sum_dask)  # type: ignore[arg-type]
        np.testing.assert_allclose(sum_dask, clipped_sum(rows, 1.0), rtol=1e-12)
        partition = random_partition(600, 12, np.random.default_rng(5))
        bases_array = subset_bases(rows, partition, 2)
        for source in (in_process, on_dask):
            bases = subset_bases(source, partition, 2)  # type: ignore[arg-type]
            assert bases.shape == (12, 6, 2)
            worst = max(subspace_distance(a, b) for a, b in zip(bases, bases_array, strict=True))
            assert worst < 1e-9
    finally:
        on_dask.close()


def test_a_changed_or_removed_object_is_named(
    tmp_path: Path, s3_endpoint: str, bucket: str, stored: tuple[np.ndarray[Any, Any], list[str]]
) -> None:
    rows, names = stored
    settings = _settings(tmp_path, s3_endpoint, bucket, None)
    source = ParquetRows(inspect(f"s3://{bucket}/data", names, settings), settings)
    source.check_unchanged()
    fs = s3fs_for(s3_endpoint)
    write_parquet(fs, f"{bucket}/data/part-1.parquet", rows[350:] * 0.5, 50)
    with pytest.raises(ReferenceFault, match=f"{bucket}/data/part-1.parquet changed"):
        source.check_unchanged()
    fs.rm(f"{bucket}/data/part-0.parquet")
    with pytest.raises(ReferenceFault, match=f"{bucket}/data/part-0.parquet changed"):
        source.check_unchanged()
