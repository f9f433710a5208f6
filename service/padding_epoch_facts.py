"""The epochs pending at a moment, in the workers' order, made in Python from public facts read
once (:class:`Facts`): what :class:`service.padding_epochs._Chain` walks to pad a job behind the
pending continual epochs (issue 33: split from :mod:`service.padding_epochs`, which keeps the
chain and the padding's formulas).

Why one read: the pending list's statement was run again at almost every point the chain asked
about (546 statements for one request at 100 releases on 100 datasets), the chain's cost
quadratic in the epochs pending (docs/benchmarks.md); its text is kept as the reference in
``tests/continual/test_chain_sweep.py``. Every input is public: the releases' requests and
``visible_at``, the batches' commits and sizes, the datasets' deletions, and which epochs,
re-check verdicts and ends are *shown* at the moment asked about, never what a worker stored
before it shows.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Select, bindparam, or_, select
from sqlalchemy.orm import Session

from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch
from service.mechanisms.registry import MECHANISMS
from service.padding_queue import shown_unfinished

#: An epoch's place in the workers' order: its point (the later of its batch's commit and its
#: release's request: :func:`point`), its release's request and id, its batch. A worker takes
#: the waiting job of the earliest point first (:data:`service.continual.WORK_SINCE`), and
#: continues a release with its next epoch only if nothing claimable comes before that epoch
#: (:func:`service.continual.next_input`), so an epoch runs after exactly the epochs of a
#: smaller key that are not finished, and never after a job requested after its point.
Key = tuple[datetime, datetime, str, int]


def point(act: datetime, requested: datetime) -> datetime:
    """The moment an epoch's work comes (its order among the jobs, and the moment its queue is
    read at): the later of its act (the batch's commit) and its release's request."""
    return max(act, requested)


#: An end's ``batch_seq`` in its :data:`Key`: after every epoch of its release at its point.
END_SEQ = 1 << 30


@dataclass(frozen=True)
class End:
    """A continual release's end after its dataset's deletion, as the chain counts it: the
    :data:`Key` fields of a :class:`Row`, the release's ``visible_at`` and the deletion (its due
    moment: :meth:`service.padding_epochs._Chain.end_due`)."""

    release_id: Any
    created_at: datetime
    batch_created_at: datetime
    batch_seq: int
    visible_at: datetime
    deleted_at: datetime


@dataclass
class Point:
    """The epochs pending at one moment in the workers' order, and the running maximum of
    their next public moments (as far as computed)."""

    keys: list[Key]
    rows: list[Any]
    latest: list[datetime]
    points: list[datetime]


class Row(NamedTuple):
    """A pending epoch: the columns the pending list's statement gave (its batch's ``seq``,
    commit and rows, the release's shown epochs and the last shown one's due moment)."""

    release_id: Any
    created_at: datetime
    shown: int
    mechanism: str
    k: int
    params: dict[str, Any]
    visible_at: datetime | None
    dataset_rows: int
    n_cols: int
    deleted_at: datetime | None
    batch_seq: int
    batch_created_at: datetime
    batch_rows: int
    previous_visible_at: datetime | None
    #: The release's id as text (a cheaper key than the UUID: the chain's moments).
    ident: str


@dataclass
class Rel:
    """A continual release read by :class:`Facts`, with its dataset's columns and its
    epochs' public moments: ``seen`` the sorted ``visible_at``, ``checks`` the re-checks
    ``(epoch, verdict, shown_at)`` by epoch, ``dues`` each epoch's due moment
    (:func:`previous_due`)."""

    id: Any
    created_at: datetime
    mechanism: str
    k: int
    params: dict[str, Any]
    visible_at: datetime | None
    outcome_visible_at: datetime | None
    status: str
    dataset_id: Any
    dataset_rows: int
    n_cols: int
    deleted_at: datetime | None
    horizon: int
    seen: list[datetime]
    checks: list[tuple[int, str, datetime | None]]
    dues: dict[int, datetime | None]
    ident: str = ""
    #: Its rows by ``(batch seq, shown)`` (:meth:`Facts.point`).
    rows: dict[tuple[int, int], Row] = field(default_factory=dict)

    def unfinished(self, at: datetime) -> bool:
        """Its end not shown at ``at`` (:func:`service.padding_queue.shown_unfinished`)."""
        if self.outcome_visible_at is None:
            return self.status in ("queued", "running")
        return self.outcome_visible_at > at

    def shown(self, at: datetime) -> int | None:
        """The epochs shown at ``at`` (at the deletion, if before; none from the first whose
        re-check is not shown ``unchanged``), or ``None`` when that first one's verdict is
        shown ``changed`` (the release shown ended there)."""
        seen_by = self.deleted_at if self.deleted_at is not None and self.deleted_at < at else at
        n_visible = bisect.bisect_right(self.seen, seen_by)
        for epoch, check, shown_at in self.checks:
            if check != "unchanged" or shown_at is None or shown_at > at:
                if check == "changed" and shown_at is not None and shown_at <= at:
                    return None
                return epoch - 1 if epoch - 1 < n_visible else n_visible
        return n_visible


class Facts:
    """The public facts the chain's pending lists are made from, read once (three statements,
    a fourth or so when the releases read reach further back): every continual release
    requested by ``high`` whose end is not shown at ``low`` (so every one pending at a moment
    in ``[low, high]``), its dataset's batches committed by ``high`` and its epochs; ``low``
    lowered to the earliest request or deletion among them, so that every point the chain
    asks about (never before a pending epoch's release's request, or an end's deletion) is
    covered."""

    def __init__(
        self, rels: list[Rel], batches: dict[Any, list[Any]], low: datetime, high: datetime
    ) -> None:
        self.low = low
        self.high = high
        self.rels = rels
        self.deleted = sorted(
            (rel for rel in rels if rel.deleted_at is not None and rel.visible_at is not None),
            key=lambda rel: str(rel.id),
        )
        items: list[tuple[Key, Rel, Any]] = []
        for rel in rels:
            for batch in batches.get(rel.dataset_id, ()):
                seq = int(batch.seq)
                if seq + 1 <= rel.horizon:
                    at = point(batch.created_at, rel.created_at)
                    items.append(((at, rel.created_at, rel.ident, seq), rel, batch))
        items.sort(key=lambda item: item[0])
        self.items = items
        self.item_points = [item[0][0] for item in items]
        self.one_shot: list[tuple[datetime, datetime, datetime | None, str]] | None = None

    @classmethod
    def read(
        cls, session: Session, continual: tuple[str, ...], low: datetime, high: datetime
    ) -> Facts:
        """The facts for the moments in ``[low, high]`` (lowered as the class says)."""
        statements = _statements(continual)
        while True:
            found = session.execute(statements[0], {"low": low, "high": high}).all()
            earliest = min(
                (m for row in found for m in (row.created_at, row.deleted_at) if m is not None),
                default=low,
            )
            if earliest >= low:
                break
            low = earliest
        epochs: dict[Any, list[Any]] = {}
        for row in session.execute(statements[1], {"low": low, "high": high}).all():
            epochs.setdefault(row.release_id, []).append(row)
        batches: dict[Any, list[Any]] = {}
        for row in session.execute(statements[2], {"low": low, "high": high}).all():
            batches.setdefault(row.dataset_id, []).append(row)
        rels = []
        for row in found:
            own = sorted(epochs.get(row.id, ()), key=lambda epoch: int(epoch.epoch))
            rels.append(
                Rel(
                    row.id,
                    row.created_at,
                    row.mechanism,
                    row.k,
                    row.params,
                    row.visible_at,
                    row.outcome_visible_at,
                    row.status,
                    row.dataset_id,
                    row.dataset_rows,
                    row.n_cols,
                    row.deleted_at,
                    int(row.params.get("horizon", 0)),
                    sorted(epoch.visible_at for epoch in own if epoch.visible_at is not None),
                    [
                        (int(epoch.epoch), epoch.reference_check, epoch.reference_shown_at)
                        for epoch in own
                        if epoch.reference_check is not None
                    ],
                    {
                        int(epoch.epoch): epoch.due_at
                        if epoch.due_at is not None
                        else epoch.visible_at
                        for epoch in own
                    },
                    str(row.id),
                )
            )
        return cls(rels, batches, low, high)

    def idle(self, session: Session, at: datetime) -> bool:
        """Whether the one-shot queue (:func:`service.padding_queue.queue_parts`'
        ``only_one_shot`` statement) has no row at ``at`` in ``[low, high]``: no one-shot
        release with a ``visible_at`` requested by ``at`` whose ``visible_at`` is after ``at``
        or whose end is not shown at ``at`` (one statement, the first time: those that may be
        such a row at some moment in ``[low, high]``)."""
        if not self.low <= at <= self.high:
            return False
        if self.one_shot is None:
            names = [name for name, mechanism in MECHANISMS.items() if not mechanism.continual]
            self.one_shot = [
                (row.created_at, row.visible_at, row.outcome_visible_at, row.status)
                for row in session.execute(
                    _ONE_SHOT, {"low": self.low, "high": self.high, "names": names}
                ).all()
            ]
        for created, visible, outcome, status in self.one_shot:
            if created <= at and (
                visible > at
                or (outcome is None and status in ("queued", "running"))
                or (outcome is not None and outcome > at)
            ):
                return False
        return True

    def point(self, at: datetime) -> Point:
        """The pending list at ``at``: the epochs of the continual releases requested by
        ``at`` whose end is not shown at ``at`` (nor cut by a changed object's verdict shown),
        on each batch committed by ``at`` from the first epoch's not shown at ``at`` on, up to
        the horizon; and the ends pending after a deletion (:class:`End`)."""
        states: dict[int, int | None] = {}
        keys: list[Key] = []
        rows: list[Any] = []
        first: dict[str, Row] = {}
        for key, rel, batch in self.items[: bisect.bisect_right(self.item_points, at)]:
            shown = states.get(id(rel), -1)
            if shown == -1:
                shown = states[id(rel)] = rel.shown(at) if rel.unfinished(at) else None
            if shown is None or key[3] < shown:
                continue
            row = rel.rows.get((key[3], shown))
            if row is None:
                row = rel.rows[(key[3], shown)] = Row(
                    rel.id,
                    rel.created_at,
                    shown,
                    rel.mechanism,
                    rel.k,
                    rel.params,
                    rel.visible_at,
                    rel.dataset_rows,
                    rel.n_cols,
                    rel.deleted_at,
                    key[3],
                    batch.created_at,
                    batch.n_rows,
                    rel.dues.get(shown),
                    rel.ident,
                )
            keys.append(key)
            rows.append(row)
            if rel.deleted_at is not None:
                earlier = first.get(rel.ident)
                if earlier is None or earlier.batch_seq > key[3]:
                    first[rel.ident] = row
        ends: list[tuple[Key, End]] = []
        for rel in self.deleted:
            assert rel.deleted_at is not None and rel.visible_at is not None
            if rel.created_at > at or rel.deleted_at > at or not rel.unfinished(at):
                continue
            epoch = first.get(rel.ident)
            came = rel.deleted_at if epoch is None else epoch.batch_created_at
            end = End(rel.id, rel.created_at, came, END_SEQ, rel.visible_at, rel.deleted_at)
            ends.append((pending_key(end), end))
        if ends:
            keyed = sorted([*zip(keys, rows, strict=True), *ends], key=lambda pair: pair[0])
            keys = [key for key, _ in keyed]
            rows = [row for _, row in keyed]
        return Point(keys, rows, [], [key[0] for key in keys])


#: The one-shot releases that may be in the queue at a moment in ``[low, high]``
#: (:meth:`Facts.idle`).
_ONE_SHOT: Any = select(
    Release.created_at, Release.visible_at, Release.outcome_visible_at, Release.status
).where(
    Release.mechanism.in_(bindparam("names", expanding=True)),
    Release.created_at <= bindparam("high"),
    Release.visible_at.is_not(None),
    or_(Release.visible_at > bindparam("low"), shown_unfinished(bindparam("low"))),
)


@functools.cache
def _statements(continual: tuple[str, ...]) -> tuple[Select[Any], ...]:
    """:class:`Facts`' three statements (``low``, ``high``): the continual releases requested
    by ``high`` whose end is not shown at ``low`` with their dataset's columns, their epochs,
    and their datasets' batches committed by ``high``. Built once per set of names."""
    low: Any = bindparam("low")
    high: Any = bindparam("high")
    where = (
        Release.mechanism.in_(continual),
        Release.created_at <= high,
        shown_unfinished(low),
    )
    releases: Select[Any] = (
        select(
            Release.id,
            Release.created_at,
            Release.mechanism,
            Release.k,
            Release.params,
            Release.visible_at,
            Release.outcome_visible_at,
            Release.status,
            Release.dataset_id,
            Dataset.n_rows.label("dataset_rows"),
            Dataset.n_cols,
            Dataset.deleted_at,
        )
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(*where)
    )
    epochs: Any = select(
        ReleaseEpoch.release_id,
        ReleaseEpoch.epoch,
        ReleaseEpoch.visible_at,
        ReleaseEpoch.reference_check,
        ReleaseEpoch.reference_shown_at,
        ReleaseEpoch.due_at,
    ).where(ReleaseEpoch.release_id.in_(select(Release.id).where(*where)))
    batches: Any = select(
        DatasetBatch.dataset_id,
        DatasetBatch.seq,
        DatasetBatch.created_at,
        DatasetBatch.n_rows,
    ).where(
        DatasetBatch.dataset_id.in_(select(Release.dataset_id).where(*where)),
        DatasetBatch.created_at <= high,
    )
    return releases, epochs, batches


def pending_key(row: Any) -> Key:
    """A pending row's (:class:`Row`, :class:`End`) :data:`Key`."""
    return (
        point(row.batch_created_at, row.created_at),
        row.created_at,
        str(row.release_id),
        int(row.batch_seq),
    )
