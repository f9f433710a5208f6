"""A worker process that SIGKILLs itself right after storing epoch ``DPSS_TEST_KILL_AT`` of a
continual release (``python -m tests.continual.kill_worker``; settings from ``DPSS_*``)."""

from __future__ import annotations

import os
import signal

from service import continual
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.store import DatasetStore
from service.worker import ClaimedJob, Worker


def main() -> None:
    kill_at = int(os.environ["DPSS_TEST_KILL_AT"])

    def kill_between_epochs(job: ClaimedJob, epoch: int) -> None:
        if epoch == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    continual.on_epoch_stored = kill_between_epochs
    settings = Settings()
    factory = make_session_factory(make_engine(settings.database_url))
    store = DatasetStore(settings.datasets_dir)
    Worker(factory, store, settings, worker_id="doomed", isolate=True).run_pending()


if __name__ == "__main__":
    main()
