"""bench/bench_forecast_default.py (issue 32 item 4, the forecast as a PrivatePCA user meets
it): a cell runs the dry run's own ``forecast_from`` path for ``auto`` and scores it."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from bench.bench_forecast_default import PRIOR_COLUMNS, cell, datasets


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
    # The release's own interval and stated share: digits at eps 1 is measured, not hidden.
    assert 0.0 <= found["interval_cover"] <= 1.0
    assert found["stated"] == 2 and found["stated_abs"] < 0.1


def test_mnist_is_skipped_not_fetched_without_its_cached_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPSS_BENCH_DATA_DIR", str(tmp_path))
    assert "MNIST 4000x784" not in datasets(True)


def test_the_priors_are_skipped_with_mnist_when_its_sample_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPSS_BENCH_DATA_DIR", str(tmp_path))
    assert [name for name in datasets(True, True) if "MNIST" in name] == []


def test_inside_a_prior_the_rows_are_the_private_rows_projected_onto_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sandbox moves HOME; the benches' cache is under the real one (read, not written).
    home = Path(os.environ.get("DPSS_TEST_REAL_HOME", str(Path.home())))
    default = home / ".cache" / "dpss-bench-data"
    cache = Path(os.environ.get("DPSS_BENCH_DATA_DIR", str(default))) / "mnist_5k.npz"
    if not cache.exists():
        pytest.skip("the MNIST sample is not cached (no network in the tests)")
    monkeypatch.setenv("DPSS_BENCH_DATA_DIR", str(cache.parent))
    sets = datasets(True, True)
    private = sets["MNIST 4000x784"]
    inside = sets[f"MNIST, DCT prior {PRIOR_COLUMNS}"]
    assert inside.shape == (private.shape[0], PRIOR_COLUMNS)
    # A projection onto orthonormal columns: no row grows past the bound of 1 (unit rows).
    assert float(np.max(np.linalg.norm(inside, axis=1))) <= 1.0 + 1e-12
    public_split = sets[f"MNIST, public-split prior {PRIOR_COLUMNS}"]
    # Both priors hold most of the rows' squared norm, far above a random 64 of 784 columns'
    # 0.08 (a wrong projection, e.g. the prior's rows for its columns, would not).
    assert float(np.mean(np.sum(public_split**2, axis=1))) > 0.5
    assert float(np.mean(np.sum(inside**2, axis=1))) > 0.5
