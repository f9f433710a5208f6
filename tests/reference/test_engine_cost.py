"""The engine's cheaper pass (issue 35, item 3): a release checks the rows it reads as
registration does with one conversion, Dask does not walk a task's arguments, and a Dask
worker's heap reuses row-group buffers while a task runs and gives them back after."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from service.reference import heap
from service.reference.engine import _Args, _call, _run_sum, _task
from service.reference.integrity import Piece, _bad_values, checked_matrix


@pytest.mark.parametrize(
    "values",
    [
        [1.0, -2.0, 3.5],
        [1.0, np.nan, 3.0],
        [np.inf, 0.0, 1.0],
        [0.0, 0.0, -np.inf],
        [np.nan, np.inf, -np.inf],
        [1e308, -1e308, 5e-324],
    ],
)
def test_checked_matrix_decides_as_registration_does(values: list[float]) -> None:
    table = pa.table({"a": pa.array(values), "b": pa.array([1, 2, 3], pa.int32())})
    matrix = checked_matrix(table, ["a", "b"])
    assert (matrix is None) == (_bad_values(table, ["a", "b"]) is not None)
    if matrix is not None:
        np.testing.assert_array_equal(matrix, np.column_stack([values, [1.0, 2.0, 3.0]]))


def test_checked_matrix_refuses_a_null() -> None:
    table = pa.table({"a": pa.array([1.0, None, 2.0])})
    assert _bad_values(table, ["a"]) is not None
    assert checked_matrix(table, ["a"]) is None
    assert checked_matrix(pa.table({"a": pa.array([], pa.float64())}), ["a"]) is not None


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad, 0))
        return 1


@pytest.fixture
def idle_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module's state as in a process where no task ran: an earlier test's pass in this
    process (its real thresholds raised, their restore pending for RESTORE_SECONDS) must not
    decide what these tests see (under xdist one failed when it ran within that second)."""
    with heap._lock:
        if heap._timer is not None:
            heap._timer.cancel()
    monkeypatch.setattr(heap, "_timer", None)
    monkeypatch.setattr(heap, "_raised", None)
    monkeypatch.setattr(heap, "_active", 0)


def test_reused_buffers_raises_the_thresholds_once_and_restores_the_environments(
    monkeypatch: pytest.MonkeyPatch, idle_heap: None
) -> None:
    libc = _Libc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    monkeypatch.setattr(heap, "RESTORE_SECONDS", 0.0)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with heap.reused_buffers():
        with heap.reused_buffers():  # a second task of the process (threads_per_worker > 1)
            pass
        assert libc.calls == [
            ("mallopt", -3, heap.TASK_MMAP_THRESHOLD),
            ("mallopt", -1, heap.TASK_TRIM_THRESHOLD),
        ]
    # Restored when the last task ends (also on an error), the heap trimmed.
    assert libc.calls[2:] == [
        ("mallopt", -3, 128 * 1024),
        ("mallopt", -1, 65536),
        ("malloc_trim", 0, 0),
    ]
    libc.calls.clear()
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "262144")
    with pytest.raises(RuntimeError), heap.reused_buffers():
        raise RuntimeError
    assert libc.calls[2:4] == [("mallopt", -3, 262144), ("mallopt", -1, 65536)]
    assert heap._active == 0


def test_the_thresholds_outlive_a_task_until_the_process_is_idle(
    monkeypatch: pytest.MonkeyPatch, idle_heap: None
) -> None:
    """The next task of a pass starting within RESTORE_SECONDS finds the thresholds raised
    (no mallopt again); once no task ran for that long, they are put back and the heap
    trimmed."""
    libc = _Libc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    monkeypatch.setattr(heap, "RESTORE_SECONDS", 60.0)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with heap.reused_buffers():
        pass
    timer = heap._timer
    assert timer is not None and timer.is_alive()
    with heap.reused_buffers():  # the next task: the pending restore is cancelled
        assert not timer.is_alive() or timer.finished.is_set()
    assert [call[0] for call in libc.calls] == ["mallopt", "mallopt"]
    assert heap._timer is not None
    heap._timer.cancel()
    heap._restore_if_idle()  # what the timer does when it fires
    assert libc.calls[2:] == [
        ("mallopt", -3, 128 * 1024),
        ("mallopt", -1, 65536),
        ("malloc_trim", 0, 0),
    ]
    heap._restore_if_idle()  # nothing raised any more: nothing to put back
    assert len(libc.calls) == 5 and heap._raised is None


def test_reused_buffers_leaves_dynamic_thresholds_alone(
    monkeypatch: pytest.MonkeyPatch, idle_heap: None
) -> None:
    """Without the nanny's variable glibc adapts its thresholds itself; a mallopt would stop it
    for good, so nothing is called (the worker's own passes in process)."""
    libc = _Libc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with heap.reused_buffers():
        pass
    assert libc.calls == []


def test_a_task_is_keyed_by_its_function_and_its_arguments_are_not_walked() -> None:
    seen: list[Any] = []

    def part(location: Any, piece: Piece, columns: Any, record: Any, *args: Any) -> Any:
        seen.append((piece.row_group, args))
        return np.full((2, 2), float(piece.rows))

    pieces = [Piece("p", g, 10 * g, 10 + g) for g in range(3)]
    delayed = _task(_run_sum, part, None, pieces, ["a"], [{}, {}, {}], (7,))
    assert str(delayed.key).startswith("_run_sum-")
    assert _task(_run_sum, part, None, pieces, ["a"], [{}] * 3, ()).key != delayed.key
    (result,) = __import__("dask").compute(delayed, scheduler="sync")
    np.testing.assert_array_equal(result, np.full((2, 2), 33.0))
    assert seen == [(0, (7,)), (1, (7,)), (2, (7,))]
    assert _call(max, _Args(3, 9, 4)) == 9
