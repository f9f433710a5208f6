"""The data directory against the database: every live dataset's file is there and complete,
and no file holds raw rows that no dataset names (which nobody could delete through the API).

Run by ``dpss audit verify`` next to the chain; a restore of the database or of the data
directory alone, or a lost volume, shows here. A release whose file is missing ends ``failed``
and refunded in the worker (:data:`service.jobs.DATASET_FILE_FAULT_REASON`).
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Dataset
from service.store import DatasetStore

#: A file younger than this that no dataset names may be an upload whose transaction has not
#: committed yet: noted, not judged.
ORPHAN_GRACE_SECONDS = 600.0


def check(session: Session, store: DatasetStore) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of the store at ``store.root`` against the datasets in
    ``session``. Names and sizes only: no file is read beyond its header."""
    problems: list[str] = []
    notes: list[str] = []
    live = list(
        session.execute(
            select(
                Dataset.id,
                Dataset.file_name,
                Dataset.n_rows,
                Dataset.n_cols,
                Dataset.privacy_unit_column.is_not(None),
            ).where(
                Dataset.file_name.is_not(None),
                # By reference: no file here (the objects are checked before each release).
                Dataset.reference.is_(None),
            )
        )
    )
    if not store.root.is_dir():
        if live:
            problems.append(
                f"no dataset directory at {store.root}, but the database has {len(live)} "
                "datasets with files: the files were lost, or DPSS_DATA_DIR is not the "
                "service's data directory"
            )
        else:
            notes.append(f"no dataset directory at {store.root} (no dataset has a file)")
        return problems, notes
    named = {str(file_name) for _, file_name, _, _, _ in live}
    for dataset_id, file_name, n_rows, n_cols, person_level in live:
        fault = store.fault(str(file_name), int(n_rows), int(n_cols))
        if fault is None and person_level:
            fault = store.units_fault(str(file_name), int(n_rows))
        if fault is not None:
            problems.append(
                f"dataset {dataset_id}: its file {file_name} {fault} (its releases end failed, "
                "refunded)"
            )
    now = time.time()
    for name in store.stored_files():
        if name in named:
            continue
        try:
            age = now - store.path_of(name).stat().st_mtime
        except FileNotFoundError:
            continue
        if age < ORPHAN_GRACE_SECONDS:
            notes.append(f"{name} in {store.root} is named by no dataset yet (an upload?)")
        else:
            problems.append(
                f"orphaned file {name} in {store.root}: no dataset names it, so no API call can "
                "delete its rows (left by a restore of the database, or a purge that failed); "
                "remove it by hand once you know whose it is"
            )
    if live or named:
        notes.append(f"{len(live)} dataset files checked in {store.root}")
    return problems, notes
