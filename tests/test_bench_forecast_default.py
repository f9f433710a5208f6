"""bench/bench_forecast_default.py (issue 32 item 4, the forecast as a PrivatePCA user meets
it): a cell runs the dry run's own ``forecast_from`` path for ``auto`` and scores it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.bench_forecast_default import cell, datasets


def test_a_cell_scores_the_dry_runs_forecast_against_the_release() -> None:
    rows = datasets(False)["digits"]
    found = cell(rows, 2, 1.0, 2)
    assert found["runs"] == 2 and found["forecasts"] == 2
    assert found["mechanism"] == "analyze_gauss"
    assert 0.0 < found["kept_mean"] < 1.0 and found["kept_sd"] >= 0.0
    assert 0.0 <= found["cover"] <= 1.0 and 0.0 < found["width"] <= 1.0
    # A point's error is scored only where the dry run stated one.
    assert found["points"] <= found["forecasts"]
    assert math.isnan(found["point_abs"]) == (found["points"] == 0)


def test_mnist_is_skipped_not_fetched_without_its_cached_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPSS_BENCH_DATA_DIR", str(tmp_path))
    assert "MNIST 4000x784" not in datasets(True)
