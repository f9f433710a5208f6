"""The padding's queue term, shared by releases and registrations by reference: the modelled
time of the one-shot jobs requested before a job and not yet past their own ``visible_at``
(public facts fixed at the request: :mod:`service.padding`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service import calibration
from service.config import Settings
from service.db.models import Dataset, Release
from service.mechanisms.registry import MECHANISMS
from service.padding import PaddingModel


def padding_model(session: Session, settings: Settings, now: datetime) -> PaddingModel:
    """The padding model at ``now``: the settings and the calibrated rates (if on)."""
    calibrated = (
        calibration.current_rates(session, now) if settings.release_padding_calibrated else None
    )
    return PaddingModel.from_settings(settings, calibrated)


#: The one-shot jobs ahead of a request at ``now`` (:func:`queue_seconds`), built once: built
#: per request it cost 0.4 ms of CPU on each (``bench/bench_release_cpu.py``).
_AHEAD = (
    select(
        Release.mechanism,
        Release.n_rows_read,
        Dataset.n_rows,
        Dataset.n_cols,
        Release.k,
        Release.params,
    )
    .join(Dataset, Dataset.id == Release.dataset_id)
    .where(
        Release.created_at <= bindparam("now"),
        Release.visible_at.is_not(None),
        Release.visible_at > bindparam("now"),
    )
)


def queue_seconds(session: Session, model: PaddingModel, now: datetime) -> float:
    """The modelled time of the one-shot jobs ahead of a job requested at ``now``: those
    requested by ``now`` and not yet past their own ``visible_at`` (:meth:`PaddingModel.
    queue_seconds`), calibrated or not. Without it a job requested behind a long one was
    padded as if the queue were empty, and whether it showed at its ``visible_at`` or at a
    late step told its requester whether the job ahead (anyone's, on any dataset) had really
    ended, long before that job's own ``visible_at``."""
    ahead = session.execute(_AHEAD, {"now": now}).all()
    return model.queue_seconds(
        [
            # n_rows_read is fixed at the request for one-shot releases (the rows present
            # then); Dataset.n_rows only for rows stored before that column existed.
            (name, n_read if n_read is not None else n, d, k_, job_params or {})
            for name, n_read, n, d, k_, job_params in ahead
            if name in MECHANISMS and not MECHANISMS[name].continual
        ]
    )
