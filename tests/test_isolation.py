"""The worker's run process (service/isolation.py): one process for many runs, replaced when a
run kills it or lets an exception escape, ended with the worker."""

from __future__ import annotations

import functools
import os
import pickle
import threading

import psutil

from service.config import Settings
from service.isolation import RunProcess


def pid() -> int:
    return os.getpid()


def die() -> int:
    os._exit(9)


def escape(message: str) -> int:
    raise ArithmeticError(message)


def blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


def test_one_process_serves_many_runs_apart_from_the_worker() -> None:
    runs = RunProcess(Settings(worker_blas_threads=1), None)
    try:
        first, second = runs.run("a", pid), runs.run("b", pid)
        assert first is not None and first == second and first != os.getpid()
        # BLAS limited once, for the process's life, as blas_threads() did around each run.
        assert set(runs.run("c", blas_threads) or []) == {1}
    finally:
        runs.close()
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"


def test_a_run_that_kills_its_process_gives_none_and_the_next_run_a_new_process() -> None:
    runs = RunProcess(Settings(), None)
    try:
        before = runs.run("a", pid)
        assert runs.run("release x", die) is None
        after = runs.run("b", pid)
        assert after is not None and after != before
    finally:
        runs.close()


def test_an_escaping_exception_ends_the_process_without_its_message(caplog) -> None:
    runs = RunProcess(Settings(), None)
    try:
        secret = "271828.18284-row-value"
        before = runs.run("a", pid)
        assert runs.run("release y", functools.partial(escape, secret)) is None
        assert secret not in caplog.text
        assert "release y: the run's process ended without an outcome" in caplog.text
        assert runs.run("b", pid) not in (None, before)
    finally:
        runs.close()


def test_a_run_from_another_thread_gets_a_process_of_that_thread() -> None:
    """``PR_SET_PDEATHSIG`` fires when the forking thread ends: a process forked by a thread
    that may end is not reused from another one."""
    runs = RunProcess(Settings(), None)
    seen: list[int | None] = []
    try:
        thread = threading.Thread(target=lambda: seen.append(runs.run("a", pid)))
        thread.start()
        thread.join()
        mine = runs.run("b", pid)
        assert seen[0] is not None and mine is not None and mine != seen[0]
        assert runs.run("c", pid) == mine
    finally:
        runs.close()


def lease_and_rates(settings: Settings) -> tuple[float, dict[str, float], int]:
    return settings.worker_lease_seconds, dict(settings.release_padding_rates), id(settings)


def test_the_settings_go_by_reference_while_unchanged_and_whole_once_changed() -> None:
    """The run process holds the worker's settings from the fork: a run's work names them by
    reference (no pickled copy per run) until they change; a change made after the fork (an
    attribute, or inside a dict) reaches the run as before, pickled whole."""
    settings = Settings(worker_lease_seconds=61)
    runs = RunProcess(settings, None)
    try:
        work = functools.partial(lease_and_rates, settings)
        lease, rates, held = runs.run("a", work) or (0, {}, 0)
        assert lease == 61 and rates == settings.release_padding_rates
        assert runs.run("b", work) == (61, rates, held)  # the process's own object, reused
        whole = len(pickle.dumps(settings))
        assert len(runs._pickled(("c", work))) < whole / 4
        settings.worker_lease_seconds = 62
        assert len(runs._pickled(("c", work))) > whole
        lease, _, copied = runs.run("c", work) or (0, {}, 0)
        assert lease == 62 and copied != held
        settings.worker_lease_seconds = 61
        assert runs.run("d", work) == (61, rates, held)  # as at the fork again
        settings.release_padding_rates["analyze_gauss"] = 123.0
        assert runs.run("e", work)[1]["analyze_gauss"] == 123.0  # type: ignore[index]
    finally:
        runs.close()
