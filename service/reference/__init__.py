"""Datasets by reference: Parquet on S3-compatible object storage or a shared filesystem.

An owner registers ``s3://bucket/prefix/`` (the endpoint is the deployment's
``DPSS_S3_ENDPOINT_URL``) or a directory path, plus the numeric columns to use, instead of
uploading. The URI must lie under one of ``DPSS_REFERENCE_ROOTS``: the service reads with the
deployment's credentials, so an owner may name only what the operator opened to references.

**Registration** (:func:`~service.reference.register.inspect`, run by a worker as a job the
owner polls, see :mod:`service.registration`; the request checks only what needs no read,
:func:`~service.reference.objects.check_request`): the regular ``*.parquet`` objects under the
URI (local: by ``lstat``, symlinks not followed, a non-regular one refused unopened), sorted by
key, are the dataset; row ``i`` is the ``i``-th row of their row groups in that order (the
stable row index). Per object the footer and the chosen columns' chunks are read as byte ranges
and their SHA-256 recorded; every value is decoded from exactly those bytes
(:class:`~service.reference.reading._Ranges`) and checked (numeric, not null, finite) one
bounded batch at a time; the rows the data pages hold
(:func:`~service.reference.integrity.page_rows`) and the rows decoded must equal the footer's
count; the whole reference is bounded by ``DPSS_MAX_DATASET_BYTES``; an object another live
dataset covers is refused by :func:`service.datasets.cover_objects`. Each object's identity (S3:
ETag, and VersionId when the bucket is versioned; a path: size and modification time in
nanoseconds, by ``lstat``) is recorded with the digests.

**Immutability.** The worker compares every object's identity with the record before a release
reads it and again before the outcome is stored
(:meth:`~service.reference.engine.ParquetRows.check_unchanged`), and each task reads its row
group through :func:`~service.reference.reading._read_piece`: a regular file opened at its
registered, resolved path under the current roots without following a symlink (S3: the recorded
version), its footer and chunks compared with their digests, the decoded rows counted and
checked as at registration. A changed, swapped or missing object ends the release ``failed``
and charged, with a reason naming no object; nothing was released (noise is drawn in the
worker, never on the cluster) and the failure is decided by digests, not by the registered
values. It is not refunded: whether a job met the change is whether it read after the owner
made it, that is when a worker claimed it, that is when the job ahead in the shared queue
ended. For the same reason what analysts and owners see of a one-shot release is decided by a
re-check of every object at a public moment after its outcome was due
(:mod:`service.reference_recheck`), not by what its job met. An object added under the URI
later is not part of the dataset and is never read (a
release reads the registered row groups only; a new prefix under batch 0's may even be the
next batch): the release runs on the registered bytes
(``tests/reference/test_reference_mutations.py``).

**Credentials** come from the deployment's environment only (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, a profile or an instance role, read by botocore in the API, the
worker and each Dask worker): never from a request body, never stored, never pickled into a Dask
task (a :class:`~service.reference.objects.Location` holds the protocol and the endpoint only).
Errors name the object and the exception type, never an exception's message (a library's message
may quote a signed URL or a header).

**Heavy passes** (:class:`~service.reference.engine.ParquetRows`, a
:class:`~service.mechanisms.linalg.RowSource`): one task per run of consecutive row groups of
about ``DPSS_DASK_TASK_MB`` (read one group at a time) computes a ``d x d`` clipped Gram matrix,
a clipped column sum or (one task per row group) the rows of a group of random subsets; the
partial results are added in row-group order, so a run on Dask (``DPSS_DASK_SCHEDULER``) and one
in process (Dask's synchronous scheduler) give the same bits when the BLAS uses one thread in
both (Dask's nanny sets it for its workers), and agree up to the BLAS kernels' summation order
otherwise. Only ``d x d``-sized results (and the ``t x d x k`` subset bases) reach the worker;
:func:`worker_bytes` adds what the worker holds besides to the memory gate. A continual
release's epoch computes its batch's Gram the same way
(:func:`~service.reference.engine.batch_of`: the batch's row groups, every object still
checked). A dataset by reference grows by batches of objects
(``POST /v1/dataset-references/{id}/batches``, :func:`service.registration.request_batch`):
each is registered by :func:`~service.reference.register.inspect` as the dataset was, and only
then joins the record, its row groups numbered after the dataset's (a one-shot release reads
the batches present at its request, :func:`~service.reference.engine.batch_of` over that
prefix). On a Dask worker a task's buffers are reused across its row groups
(:mod:`~service.reference.heap`).

**Faults.** Tasks are retried (``DPSS_DASK_RETRIES``) and the scheduler recomputes the tasks of
a lost worker; if the cluster still fails (unreachable scheduler, a task that killed its workers
repeatedly, every worker gone for ``DPSS_DASK_WAIT_SECONDS``), the release ends ``failed`` with
a fixed reason naming the exception type. Such faults do not depend on the values: every task's
memory and time are functions of the row group's public shape, and the numerical code is total
on the finite values registration admitted. Nothing was released either way; the refund
follows DESIGN's rule that a job is refunded only when it provably never read the data: a
fault before the release's first task was submitted (no worker within the wait, an unreachable
scheduler) is refunded; once a task was submitted it may have read rows (the client cannot
tell whether a pending task had started), so the cost stays charged. An object found changed
is charged (:func:`~service.reference.integrity.object_fault`: a refund would tell when the job
ran relative to the owner's change).

**The modules**, each stating what it guarantees, in import order (each imports only those
before it): :mod:`~service.reference.objects` (containment under the roots, opening regular
files without following symlinks, listing, S3 versions and ETags, identities),
:mod:`~service.reference.integrity` (the stored record, digests, footer and page-header row
counts, value checks, the faults), :mod:`~service.reference.reading` (decoding the chosen column
chunks of one row group into rows, from verified bytes only), :mod:`~service.reference.register`
(registration), :mod:`~service.reference.heap` (a Dask worker's heap while a task runs) and
:mod:`~service.reference.engine` (the passes in process or on Dask, the wait bound, fault
classification). This package re-exports the names the rest of the service uses.
"""

from service.errors import InvalidInput, PayloadTooLarge
from service.reference.engine import (
    CLUSTER_CHARGED_REASON,
    CLUSTER_REASON,
    LOST_WORKERS_REASON,
    MECHANISMS,
    NO_WORKERS_REASON,
    WATCH_SECONDS,
    ParquetRows,
    batch_of,
    mechanism_allowed,
    open_rows,
    stamp_ns,
    worker_bytes,
)
from service.reference.integrity import (
    CHANGED_REASON,
    LEGACY_REASON,
    MAX_FOOTER_BYTES,
    REFERENCE_FILE_NAME,
    UNREADABLE_REASON,
    UNSAFE_REASON,
    VALUES_REASON,
    Chunk,
    Piece,
    Reference,
    ReferenceFault,
    key_digest,
    page_rows,
)
from service.reference.objects import (
    COALESCE_GAP,
    MAX_OBJECTS,
    Location,
    NotRegular,
    _Object,
    check_request,
    object_key,
)
from service.reference.reading import _read_piece
from service.reference.register import MAX_ROW_GROUP_BYTES, inspect

__all__ = [
    "CHANGED_REASON",
    "CLUSTER_CHARGED_REASON",
    "CLUSTER_REASON",
    "COALESCE_GAP",
    "LEGACY_REASON",
    "LOST_WORKERS_REASON",
    "MAX_FOOTER_BYTES",
    "MAX_OBJECTS",
    "MAX_ROW_GROUP_BYTES",
    "MECHANISMS",
    "NO_WORKERS_REASON",
    "REFERENCE_FILE_NAME",
    "UNREADABLE_REASON",
    "UNSAFE_REASON",
    "VALUES_REASON",
    "WATCH_SECONDS",
    "Chunk",
    "InvalidInput",
    "Location",
    "NotRegular",
    "ParquetRows",
    "PayloadTooLarge",
    "Piece",
    "Reference",
    "ReferenceFault",
    "_Object",
    "_read_piece",
    "batch_of",
    "check_request",
    "inspect",
    "key_digest",
    "mechanism_allowed",
    "object_key",
    "open_rows",
    "page_rows",
    "stamp_ns",
    "worker_bytes",
]
