"""Table-like inputs without pandas: any array-like goes through ``numpy.asarray``, and a
``columns`` attribute of strings is scikit-learn's ``feature_names_in_``, checked as scikit-learn
checks it. ``Frame`` is the smallest DataFrame-shaped object (``__array__`` and ``columns``), so
the client's behaviour cannot depend on pandas itself, which the client does not install."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from dpss_client.client import Client
from dpss_client.pca import PrivatePCA
from tests.client.data import low_rank_rows


class Frame:
    """A duck-typed DataFrame: column names and ``numpy.asarray`` support, nothing else."""

    def __init__(self, values: Any, columns: list[Any]) -> None:
        self._values = np.asarray(values, dtype=np.float64)
        self.columns = list(columns)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        return self._values if dtype is None else self._values.astype(dtype)

    def __len__(self) -> int:
        return len(self._values)


def _fitted(d: int = 3, k: int = 2) -> PrivatePCA:
    pca = PrivatePCA(Client("http://127.0.0.1:9", "unused"), "ds", k, "1", "1e-6")
    pca.components_ = np.eye(d)[:k]
    pca.mean_ = np.zeros(d)
    pca.n_components_, pca.n_features_in_ = k, d
    return pca


ROWS = np.arange(12.0).reshape(4, 3)


def test_transform_takes_a_table_and_records_its_feature_names() -> None:
    pca = _fitted()
    assert not hasattr(pca, "feature_names_in_")
    out = pca.transform(Frame(ROWS, ["a", "b", "c"]))
    np.testing.assert_array_equal(out, ROWS[:, :2])
    assert list(pca.feature_names_in_) == ["a", "b", "c"]
    # The same names again: no complaint.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pca.transform(Frame(ROWS, ["a", "b", "c"]))
    assert list(pca.get_feature_names_out()) == ["privatepca0", "privatepca1"]


def test_reordered_columns_are_refused_not_projected_wrongly() -> None:
    pca = _fitted()
    pca.transform(Frame(ROWS, ["a", "b", "c"]))
    with pytest.raises(ValueError, match="same order"):
        pca.transform(Frame(ROWS[:, [2, 1, 0]], ["c", "b", "a"]))
    with pytest.raises(ValueError, match=r"unseen then: \['z'\]"):
        pca.transform(Frame(ROWS, ["a", "b", "z"]))


def test_rows_without_names_after_named_ones_warn() -> None:
    pca = _fitted()
    pca.transform(Frame(ROWS, ["a", "b", "c"]))
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        pca.transform(ROWS)


def test_any_array_like_without_string_names_is_fine() -> None:
    pca = _fitted()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(pca.transform(ROWS.tolist()), ROWS[:, :2])
        pca.transform(Frame(ROWS, [0, 1, 2]))  # integer labels are no feature names
    assert not hasattr(pca, "feature_names_in_")


def test_mixed_column_name_types_are_refused() -> None:
    with pytest.raises(TypeError, match="all are strings"):
        _fitted().transform(Frame(ROWS, ["a", 1, "c"]))


def test_upload_and_append_take_a_table(owner: Client) -> None:
    x = low_rank_rows(200, 4, 2, seed=11)
    ds = owner.upload(
        Frame(x, ["w", "x", "y", "z"]),
        name="frame",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    assert (ds.n_rows, ds.n_cols) == (200, 4)
    batch = owner.append_rows(ds.id, x[:10].tolist())
    assert owner.dataset(ds.id).n_rows == 210, batch


def test_a_privacy_unit_column_named_in_a_table(owner: Client) -> None:
    x = low_rank_rows(200, 3, 2, seed=12)
    people = np.repeat(np.arange(100.0), 2)[:, None]
    ds = owner.upload(
        Frame(np.hstack([x, people]), ["a", "b", "c", "patient"]),
        name="people",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
        privacy_unit_column="patient",
    )
    assert (ds.n_cols, ds.privacy_unit, ds.n_units) == (3, "person", 100)
    with pytest.raises(ValueError, match="not one of the array's column names"):
        owner.upload(
            x, name="nameless", epsilon_budget="1", delta_budget="1e-5", privacy_unit_column="id"
        )
