"""A cheap job requested behind a long one must not tell whether that one has really ended.

Until a worker has calibrated the machine, a release's padding had no queue term (the floor
and the multiplier were said to cover a queue), and a registration by reference never had one.
So a probe requested just behind another dataset's long release (padded by its model to many
seconds) was padded to the floor: if that release really ended quickly, the one worker went on
to the probe, which showed its outcome at its ``visible_at``; if not, the probe showed late, a
step later. Either way its requester learnt, long before the long release's own
``visible_at``, whether it had ended (its run time may depend on one of its rows), and a
registration costs no budget at all. Both probes are now padded after the modelled queue
ahead, so in two worlds that differ only in whether the long release ended quickly or took
its model's time, the probe shows the same at the same moments.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.worker import Worker
from tests.conftest import Keys, bearer
from tests.reference import helpers

PAD = 1.0
#: The long job: gap_perturbation at an operator's rate (public) that models its run at
#: about 1.4 s; it really runs in milliseconds.
LONG = {"mechanism": "gap_perturbation", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
PROBE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
#: When, after the probe's request, the slow world's worker reaches the queue: after the
#: probe's former visible_at (PAD), long before the long job's own.
SLOW_START = PAD + 0.5


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(
        update={
            "reference_roots": str(root),
            "release_padding_floor_seconds": PAD,
            "release_padding_calibrated": False,
            "release_padding_rates": {"gap_perturbation": 3000.0},
        }
    )


def _at(moment: str) -> float:
    """Seconds from now to ``moment`` (an API timestamp)."""
    when = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return (when - datetime.now(when.tzinfo)).total_seconds()


@pytest.mark.parametrize("probe_kind", ["release", "registration"])
def test_a_probe_behind_a_long_job_shows_the_same_whether_it_ended(
    probe_kind: str,
    client: TestClient,
    keys: Keys,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
    root: Path,
) -> None:
    rows = np.random.default_rng(0).normal(size=(300, 3)) / 4
    target = upload_dataset(
        client, make_key("owner"), rows, row_norm_bound=1.0, epsilon_budget="100"
    )
    mine = upload_dataset(client, keys.owner, rows[::-1].copy(), row_norm_bound=1.0)
    seen: dict[str, Any] = {}
    for world, seed in (("fast", 1), ("slow", 2)):
        long = client.post(
            f"/v1/datasets/{target['id']}/releases", headers=bearer(keys.analyst), json=LONG
        )
        assert long.status_code == 202, long.text
        if probe_kind == "release":
            posted = client.post(
                f"/v1/datasets/{mine['id']}/releases", headers=bearer(keys.analyst), json=PROBE
            )
            url = f"/v1/releases/{posted.json()['id']}"
            field, key = "status", keys.analyst
        else:
            names = helpers.seeded_parquet(root / world, seed, 50, 2)
            posted = client.post(
                "/v1/dataset-references",
                headers=bearer(keys.owner),
                json={**helpers.FILE_BUDGET, "uri": str(root / world), "columns": names},
            )
            url = f"/v1/datasets/{posted.json()['id']}"
            field, key = "registration_status", keys.owner
        assert posted.status_code == 202, posted.text
        requested = time.monotonic()
        if world == "fast":
            worker.run_pending()  # the long job really took milliseconds; then the probe
        else:
            time.sleep(max(0.0, SLOW_START - (time.monotonic() - requested)))
            worker.run_pending()
        # The probe's first public moment (its visible_at, stored at the request), read then.
        due = client.get(url, headers=bearer(key)).json()
        shown_from = due.get("visible_at") or due.get("registration_visible_at")
        if shown_from is not None:
            time.sleep(max(0.0, _at(shown_from)) + 0.2)
        else:
            # (Before the fix a registration's visible_at is not in the answer: its floor.)
            time.sleep(max(0.0, PAD + 0.2 - (time.monotonic() - requested)))
        seen[world] = client.get(url, headers=bearer(key)).json()[field]
    assert seen["fast"] == seen["slow"], seen
