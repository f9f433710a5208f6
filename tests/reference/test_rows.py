"""The one data-access interface: a dataset by reference's heavy passes (clipped Gram, clipped
column sum, subset bases) on Dask's synchronous scheduler in process and on a LocalCluster of
worker processes give the same bits, and equal the array path up to summation order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service import reference as reference_module
from service.config import Settings
from service.errors import InvalidInput
from service.mechanisms.linalg import clipped_gram, clipped_sum, subspace_distance
from service.mechanisms.sample_aggregate import random_partition, subset_bases
from service.reference import ParquetRows, ReferenceFault, inspect, worker_bytes
from service.reference.engine import task_runs
from service.reference.integrity import Piece
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
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows, names = stored
    local = _settings(tmp_path, s3_endpoint, bucket, None)
    reference = inspect(f"s3://{bucket}/data/", names, local)
    assert reference.shape == (600, 6)
    assert len(reference.objects) == 2 and all(o["etag"] for o in reference.objects)
    # The memory gate's addition: a slot per row, one 120-row group three times, and twice the
    # largest row group's chunk bytes as read.
    stored = max(sum(c.length for c in p.chunks) for p in reference.pieces)
    assert stored > 0
    assert worker_bytes(reference.to_json()) == 8 * 600 + 3 * 8 * 120 * 6 + 2 * stored
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
        # Groups of 2 subsets, one group per pass on the cluster: 6 passes, the same U_j.
        monkeypatch.setattr(reference_module.engine, "GROUP_ROWS", 100)
        on_dask.settings = on_dask.settings.model_copy(update={"dask_pass_mb": 1e-6})
        np.testing.assert_array_equal(
            subset_bases(on_dask, partition, 2),  # type: ignore[arg-type]
            subset_bases(in_process, partition, 2),  # type: ignore[arg-type]
        )
    finally:
        on_dask.close()


def test_a_changed_or_removed_object_is_named_for_the_log_only(
    tmp_path: Path, s3_endpoint: str, bucket: str, stored: tuple[np.ndarray[Any, Any], list[str]]
) -> None:
    rows, names = stored
    settings = _settings(tmp_path, s3_endpoint, bucket, None)
    source = ParquetRows(inspect(f"s3://{bucket}/data", names, settings), settings)
    source.check_unchanged()
    fs = s3fs_for(s3_endpoint)
    write_parquet(fs, f"{bucket}/data/part-1.parquet", rows[350:] * 0.5, 50)
    # The object is named for the worker's log only; the reason a client reads names none.
    with pytest.raises(ReferenceFault, match="changed since registration") as changed:
        source.check_unchanged()
    assert changed.value.path is not None and changed.value.path.endswith("data/part-1.parquet")
    assert bucket not in changed.value.reason
    fs.rm(f"{bucket}/data/part-0.parquet")
    with pytest.raises(ReferenceFault, match="changed since registration") as removed:
        source.check_unchanged()
    assert removed.value.path is not None and removed.value.path.endswith("data/part-0.parquet")
    assert bucket not in removed.value.reason


def test_a_shared_path_under_a_root_and_refusals(tmp_path: Path) -> None:
    """A directory under DPSS_REFERENCE_ROOTS registers (size and mtime recorded) and passes;
    a path outside every root, a symlink leading out, a NaN and a text column are refused
    naming the field."""
    import fsspec

    fs = fsspec.filesystem("file")
    root, outside = tmp_path / "shared", tmp_path / "private"
    (root / "set").mkdir(parents=True)
    outside.mkdir()
    rows = np.random.default_rng(4).normal(size=(300, 3)) / 4
    names = write_parquet(fs, str(root / "set" / "a.parquet"), rows, 100)
    write_parquet(fs, str(outside / "b.parquet"), rows, 100)
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    reference = inspect(str(root / "set"), names, settings)
    assert reference.shape == (300, 3) and reference.objects[0]["mtime_ns"] > 0
    source = ParquetRows(reference, settings)
    np.testing.assert_allclose(source.clipped_gram(1.0, None), clipped_gram(rows, 1.0), rtol=1e-12)
    (root / "set" / "escape.parquet").symlink_to(outside / "b.parquet")
    assert len(inspect(str(root / "set"), names, settings).objects) == 1  # the link is skipped
    bad = rows.copy()
    bad[150, 1] = np.nan
    write_parquet(fs, str(root / "nan.parquet"), bad, 100)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"c0": ["x", "y"]}), str(root / "text.parquet"))
    for uri, columns, field, words in [
        (str(outside), names, "uri", "not under any of the roots"),
        (f"{root}/../private", names, "uri", "not under any of the roots"),
        ("relative/path", names, "uri", "absolute path"),
        (str(root / "nan.parquet"), names, "uri", "non-finite value (NaN or infinity) in row 151"),
        (str(root / "text.parquet"), ["c0"], "columns", "is not numeric"),
        (str(root / "set"), ["c0", "c0"], "columns", "named twice"),
    ]:
        with pytest.raises(InvalidInput) as refused:
            inspect(uri, columns, settings)
        assert refused.value.field == field and words in refused.value.detail
    with pytest.raises(InvalidInput, match="off"):
        inspect(str(root), names, Settings(data_dir=tmp_path))


def test_task_runs_cut_consecutive_row_groups_by_bytes() -> None:
    pieces = [Piece("a", g, 100 * g, rows) for g, rows in enumerate((100, 100, 100, 500, 50, 50))]
    runs = task_runs(pieces, row_bytes=8, budget=8 * 250)
    # 100+100 fit, the third would pass 250 rows; 500 alone (larger than the budget); 50+50.
    assert [[p.row_group for p in run] for run in runs] == [[0, 1], [2], [3], [4, 5]]
    assert [p for run in runs for p in run] == pieces  # every group once, in order
    assert task_runs(pieces, row_bytes=8, budget=1) == [[p] for p in pieces]


def test_runs_of_several_row_groups_equal_in_process_and_on_dask(
    tmp_path: Path,
    s3_endpoint: str,
    bucket: str,
    dask_scheduler: str,
    stored: tuple[np.ndarray[Any, Any], list[str]],
) -> None:
    rows, names = stored
    # Runs of two 120-row groups (5,760 bytes each): 3 tasks for 6 groups.
    update = {"dask_task_mb": 2 * 120 * 6 * 8 / 2**20}
    local = _settings(tmp_path, s3_endpoint, bucket, None).model_copy(update=update)
    reference = inspect(f"s3://{bucket}/data/", names, local)
    assert len(task_runs(reference.pieces, 8 * 6, int(update["dask_task_mb"] * 2**20))) == 3
    remote = _settings(tmp_path, s3_endpoint, bucket, dask_scheduler).model_copy(update=update)
    in_process, on_dask = ParquetRows(reference, local), ParquetRows(reference, remote)
    try:
        gram_here = clipped_gram(in_process, 1.0)  # type: ignore[arg-type]
        np.testing.assert_array_equal(gram_here, clipped_gram(on_dask, 1.0))  # type: ignore[arg-type]
        np.testing.assert_allclose(gram_here, clipped_gram(rows, 1.0), rtol=1e-12)
    finally:
        on_dask.close()
