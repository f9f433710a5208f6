"""A release requested from the service: :class:`ReleaseHandle` waits for it (long polls,
reconnects, a live-worker check, an optional progress line) and reads its result.
"""

from __future__ import annotations

import sys
import time as time  # as time: the client's waits (client.py) read the clock here too
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from api_schemas.releases import Epoch, EpochList, Release, ReleaseStatus
from dpss_client.errors import (
    DpssError,
    NoBasisError,
    ReleaseFailed,
    ReleaseNoResult,
    ServerError,
    ServiceUnreachableError,
    WaitTimeoutError,
)
from dpss_client.wire import basis_sha256

if TYPE_CHECKING:
    # numpy is imported where a basis or an array is handled: the commands that only list,
    # show or grant (and `dpss --help`) start without it (bench/bench_cli_startup.py).
    import numpy as np
    from numpy.typing import NDArray

    from dpss_client.client import Client


FINISHED: Final[frozenset[str]] = frozenset({"succeeded", "no_result", "failed"})


#: How every wait of the client pauses between polls (``ReleaseHandle.wait``,
#: ``Client.wait_registered``, a reference batch's); tests swap in one that runs the worker.
_sleep: Callable[[float], None] = time.sleep
#: The longest long poll ``ReleaseHandle.wait`` (and ``Client.release``'s wait) asks for,
#: seconds (the service allows 30).
LONG_POLL_SECONDS: float = 25.0
#: How long ``ReleaseHandle.wait`` keeps asking a service that does not answer (restarting,
#: say) before it gives up, seconds: the release goes on in the service's database.
RECONNECT_SECONDS: float = 60.0
#: How long a release may stay unfinished before the wait asks the service (``/readyz``)
#: whether any worker is alive, and how often it asks again while none is.
NO_WORKER_CHECK_SECONDS: float = 30.0


class NoWorkerWarning(UserWarning):
    """A release is waiting and the service reports no live worker: nothing will compute it
    until one starts (the API was started alone, or its worker died)."""


# --------------------------------------------------------------------------------------------
# Release handle


class ReleaseHandle:
    """A release requested from the service; ``info`` is its latest known state."""

    def __init__(self, client: Client, info: Release) -> None:
        self._client = client
        self.info = info
        #: Set when the service reported no live worker during a wait (said once per handle).
        self.no_worker: str | None = None
        self._worker_checked: float | None = None

    def __repr__(self) -> str:
        return f"<ReleaseHandle {self.id} {self.info.mechanism} k={self.info.k} {self.status}>"

    @property
    def id(self) -> UUID:
        return self.info.id

    @property
    def status(self) -> ReleaseStatus:
        return self.info.status

    @property
    def done(self) -> bool:
        return self.info.status in FINISHED

    @property
    def extras(self) -> dict[str, Any]:
        """The mechanism's further outputs (e.g. noisy eigenvalues), once finished."""
        return self.info.result.extras if self.info.result is not None else {}

    def refresh(self, wait: float | None = None) -> Release:
        """Fetch the release's state; with ``wait`` seconds, a long poll (see
        :meth:`wait_finished`): the answer comes when it has finished or after ``wait``."""
        if not wait:
            self.info = self._client._get_release(f"/v1/releases/{self.id}")
            return self.info
        self.info = self._client._get_release(
            f"/v1/releases/{self.id}",
            params={"wait": f"{wait:g}"},
            timeout=self._client._timeout_plus(wait),
        )
        return self.info

    def wait_finished(
        self,
        *,
        progress: bool = False,
        timeout: float | None = None,
        poll_interval: float = 0.2,
        max_poll_interval: float = 2.0,
        long_poll: float | None = None,
        reconnect: float = RECONNECT_SECONDS,
    ) -> Release:
        """Wait until the release has finished and return it, whatever its outcome.

        The release lives in the service's database, so a service restarted (or a connection
        lost) while waiting does not end the wait: it asks again, pausing as between polls,
        for up to ``reconnect`` seconds without an answer, and then raises the
        :class:`ServiceUnreachableError`, saying that the release goes on and how to wait
        for it again.

        Long polls (``GET /v1/releases/{id}?wait=...``, ``long_poll`` seconds each, default
        :data:`LONG_POLL_SECONDS`): the service answers as soon as the release has finished, so
        the result is seen as soon as it is visible. Against a server without long polls, with
        ``long_poll=0``, or when the service answered a long poll at once (too many waiting),
        it polls instead, pausing ``poll_interval`` seconds growing x1.5 up to
        ``max_poll_interval``.
        """
        start = time.monotonic()
        interval = poll_interval
        lost_since: float | None = None
        with _Progress(self, start, enabled=progress) as shown:
            while not self.done:
                try:
                    interval = self._wait_step(
                        shown, start, interval, timeout, max_poll_interval, long_poll
                    )
                    lost_since = None
                    if not self.done:
                        self._check_workers(start)
                except ServiceUnreachableError as error:
                    now = time.monotonic()
                    lost_since = now if lost_since is None else lost_since
                    if now - lost_since >= reconnect or (
                        timeout is not None and now - start >= timeout
                    ):
                        raise error.noted(
                            f"release {self.id} goes on in the service (asked again for "
                            f"{now - lost_since:.0f} s): wait for it again with `dpss releases "
                            f"show {self.id} --wait` or Client.get_release(id).wait()"
                        ) from error
                    _sleep(interval)
                    interval = min(interval * 1.5, max_poll_interval)
        return self.info

    def _check_workers(self, start: float) -> None:
        """After :data:`NO_WORKER_CHECK_SECONDS` unfinished, ask the service whether any
        worker is alive (again every as long while none is); with none, warn once, saying why
        the wait goes on and what starts one: without it, a service started without a worker
        left ``fit()`` waiting in silence."""
        now = time.monotonic()
        last = start if self._worker_checked is None else self._worker_checked
        if now - last < NO_WORKER_CHECK_SECONDS:
            return
        self._worker_checked = now
        if self._client.workers_alive() != 0:
            self.no_worker = None
            return
        if self.no_worker is None:
            self.no_worker = (
                f"the service at {self._client.url} reports no live worker: release {self.id} "
                "waits until one starts (`dpss worker` against the same database; `dpss serve` "
                "runs one beside the API)"
            )
            warnings.warn(self.no_worker, NoWorkerWarning, stacklevel=4)

    def _wait_step(
        self,
        shown: _Progress,
        start: float,
        interval: float,
        timeout: float | None,
        max_poll_interval: float,
        long_poll: float | None,
    ) -> float:
        """One long poll (or poll) of :meth:`wait_finished`; returns the next poll interval."""
        bound = LONG_POLL_SECONDS if long_poll is None else min(long_poll, LONG_POLL_SECONDS)
        elapsed = time.monotonic() - start
        if timeout is not None and elapsed >= timeout:
            why = f" ({self.no_worker})" if self.no_worker else ""
            raise WaitTimeoutError(
                "timeout",
                f"release {self.id} still {self.status} after {elapsed:.1f} s{why}",
            )
        left = None if timeout is None else timeout - elapsed
        if bound > 0 and not self._client._no_long_poll:
            # With a progress display, wake up every second to redraw the time.
            wait = min(bound, 1.0) if shown.enabled else bound
            wait = wait if left is None else min(wait, left)
            asked = time.monotonic()
            info = self._client._long_get(
                f"/v1/releases/{self.id}",
                Release,
                max(wait, 0.001),
                self._client._release_read(),
            )
            if info is None:  # a service from before long polls: poll instead
                return interval
            self.info = info
            answered_early = time.monotonic() - asked < wait * 0.9
            if self.done or not answered_early:
                shown.update()
                return interval
            # Answered at once, unfinished: the service is too busy to hold the wait.
        pause = interval if left is None else min(interval, left)
        _sleep(max(pause, 0.0))
        interval = min(interval * 1.5, max_poll_interval)
        self.refresh()
        shown.update()
        return interval

    def raise_for_outcome(self) -> Release:
        """Return the release if it succeeded; raise ReleaseNoResult / ReleaseFailed otherwise."""
        info = self.info
        if info.status == "no_result":
            raise ReleaseNoResult(
                "no_result",
                f"release {info.id} ({info.mechanism}) declined to release: "
                f"{info.reason or 'no reason given'}; the cost stays charged",
                info,
            )
        if info.status == "failed":
            refund = "the charge was refunded" if info.refunded else "the charge was not refunded"
            raise ReleaseFailed(
                "failed",
                f"release {info.id} ({info.mechanism}) failed: {info.reason or 'no reason given'}"
                f"; {refund}",
                info,
            )
        return info

    def basis(self) -> NDArray[np.float64]:
        """The released ``d x k`` orthonormal basis of a succeeded release."""
        import numpy as np

        info = self.raise_for_outcome()
        if info.status != "succeeded":
            raise DpssError("not_finished", f"release {info.id} is still {info.status}")
        if info.result is None or info.result.basis is None:
            raise NoBasisError(
                "no_basis",
                f"mechanism {info.mechanism} releases no basis; see .extras "
                f"({', '.join(sorted(self.extras)) or 'empty'})",
                info,
            )
        basis = np.asarray(info.result.basis, dtype=np.float64)
        if basis.ndim != 2:
            # d lists of k floats with k = 0 or d = 0 cannot be told apart from JSON alone.
            basis = basis.reshape(-1, info.k)
        expected = info.result.basis_sha256
        if expected is not None and basis_sha256(basis) != expected:
            raise ServerError(
                "integrity",
                f"release {info.id}: the basis received does not match basis_sha256 {expected}",
            )
        return basis

    def epoch_records(
        self,
        *,
        timeout: float | None = 600.0,
        poll_interval: float = 0.5,
        max_poll_interval: float = 10.0,
        after: int = 0,
        long_poll: float | None = None,
    ) -> Iterator[Epoch]:
        """Each epoch of a continual release after epoch ``after``, as it is released, oldest
        first; ends when the release has finished and every epoch was yielded.

        Long polls (``GET /v1/releases/{id}/epochs?after=...&wait=...``, ``long_poll`` seconds
        each, default :data:`LONG_POLL_SECONDS`): the service answers as soon as a new epoch is
        visible. Against a server without them or with ``long_poll=0`` it polls politely: the
        pause grows from ``poll_interval`` to ``max_poll_interval`` while nothing new arrives
        and starts over at each new epoch. :class:`WaitTimeoutError` when ``timeout`` seconds
        (``None``: forever) pass without a new epoch; raises like :meth:`raise_for_outcome`
        when the release ends ``no_result`` or ``failed``.
        """
        seen = after
        interval = poll_interval
        quiet_since = time.monotonic()
        bound = LONG_POLL_SECONDS if long_poll is None else min(long_poll, LONG_POLL_SECONDS)
        while True:
            wait = 0.0
            if bound > 0 and not self._client._no_long_poll:
                waited = time.monotonic() - quiet_since
                wait = bound if timeout is None else max(min(bound, timeout - waited), 0.0)
            path, params = f"/v1/releases/{self.id}/epochs", {"after": str(seen)}
            asked = time.monotonic()
            if wait > 0:
                long_page = self._client._long_get(path, EpochList, wait, params)
                if long_page is None:  # a service from before epoch long polls: poll instead
                    continue
                page = long_page
            else:
                page = self._client._get(path, EpochList, params=params)
            fresh = [epoch for epoch in page.items if epoch.epoch > seen]
            for epoch in fresh:
                yield epoch
                seen = epoch.epoch
            if fresh:
                interval, quiet_since = poll_interval, time.monotonic()
                if page.next is not None:
                    continue  # more on the next page: ask again after the last one seen
            self.refresh()
            if self.done:
                if page.total > seen:
                    continue  # epochs stored just before the end
                self.raise_for_outcome()
                return
            waited = time.monotonic() - quiet_since
            if timeout is not None and waited >= timeout:
                raise WaitTimeoutError(
                    "timeout", f"release {self.id}: no new epoch after {waited:.1f} s"
                )
            if wait > 0 and time.monotonic() - asked >= wait * 0.9:
                continue  # the service held the poll for its whole bound: ask again at once
            pause = interval if timeout is None else min(interval, timeout - waited)
            _sleep(max(pause, 0.0))
            interval = min(interval * 1.5, max_poll_interval)

    def epochs(self, **wait: Any) -> Iterator[NDArray[np.float64]]:
        """``for basis in handle.epochs(): ...``: each epoch's ``d x k`` basis of a continual
        release as it is released (checked against its SHA-256); options as
        :meth:`epoch_records`."""
        import numpy as np

        for epoch in self.epoch_records(**wait):
            if epoch.basis is None:
                continue
            basis = np.asarray(epoch.basis, dtype=np.float64).reshape(-1, self.info.k)
            if epoch.basis_sha256 is not None and basis_sha256(basis) != epoch.basis_sha256:
                raise ServerError(
                    "integrity",
                    f"release {self.id} epoch {epoch.epoch}: the basis received does not match "
                    f"basis_sha256 {epoch.basis_sha256}",
                )
            yield basis

    def wait(
        self,
        progress: bool = False,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.2,
        max_poll_interval: float = 2.0,
        long_poll: float | None = None,
    ) -> NDArray[np.float64]:
        """Wait until the release finishes and return its basis as a ``d x k`` array (long
        polls, or polls against an older service: see :meth:`wait_finished`).

        Raises :class:`ReleaseNoResult` or :class:`ReleaseFailed` for those outcomes,
        :class:`NoBasisError` for mechanisms that release no basis (use :meth:`wait_finished`
        and :attr:`extras` for those), and :class:`WaitTimeoutError` when ``timeout`` seconds pass.
        ``progress=True`` shows a spinner with the status and elapsed time on a terminal.
        """
        self.wait_finished(
            progress=progress,
            timeout=timeout,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
            long_poll=long_poll,
        )
        return self.basis()


class _Progress:
    """A rich spinner on stderr showing a release's status and elapsed time (terminals only)."""

    def __init__(self, handle: ReleaseHandle, start: float, *, enabled: bool) -> None:
        self._handle = handle
        self._start = start
        self._status: Any = None
        self.enabled = enabled and sys.stderr.isatty()
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status(self._text())

    def _text(self) -> str:
        info = self._handle.info
        elapsed = time.monotonic() - self._start
        # Short: the full id was printed already, and a wrapped status line redraws badly.
        return (
            f"release {str(info.id)[:8]} {info.mechanism} k={info.k}: "
            f"[bold]{info.status}[/bold] {elapsed:.1f} s"
        )

    def update(self) -> None:
        if self._status is not None:
            self._status.update(self._text())

    def __enter__(self) -> _Progress:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()
