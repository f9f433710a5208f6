"""A worker process that SIGKILLs itself during a continual release
(``python -m tests.continual.kill_worker``; settings from ``DPSS_*``):

- ``DPSS_TEST_KILL_MODE=between``: right after storing epoch ``DPSS_TEST_KILL_AT``;
- ``DPSS_TEST_KILL_MODE=in_flight``: after computing epoch ``DPSS_TEST_KILL_AT``, before storing
  it, having written the state it computed to ``DPSS_TEST_DUMP``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from service import continual
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.store import DatasetStore
from service.worker import ClaimedJob, Worker


def main() -> None:
    kill_at = int(os.environ["DPSS_TEST_KILL_AT"])
    mode = os.environ["DPSS_TEST_KILL_MODE"]

    def kill_between_epochs(job: ClaimedJob, epoch: int) -> None:
        if epoch == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    store_epoch = continual.store_epoch

    def kill_before_storing(
        session: Any, release: Any, step: Any, computed: Any, settings: Any
    ) -> Any:
        if step.epoch == kill_at:
            Path(os.environ["DPSS_TEST_DUMP"]).write_bytes(computed.state)
            os.kill(os.getpid(), signal.SIGKILL)
        return store_epoch(session, release, step, computed, settings)

    if mode == "between":
        continual.on_epoch_stored = kill_between_epochs
    else:
        continual.store_epoch = kill_before_storing
    settings = Settings()
    factory = make_session_factory(make_engine(settings.database_url))
    store = DatasetStore(settings.datasets_dir)
    Worker(factory, store, settings, worker_id="doomed", isolate=True).run_pending()


if __name__ == "__main__":
    main()
