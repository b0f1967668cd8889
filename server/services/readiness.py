"""Readiness: whether the database, the blob store and the job queue answer.

Each check returns None or a `Failure` naming the dependency, what went wrong and the fix;
`check_ready` runs all three (a broken database does not hide a broken bucket) and raises
one ServiceUnavailableError (503) listing every failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from server.blobstore import BlobStore
from server.blobstore.interface import BlobStoreError
from server.errors import ServiceUnavailableError
from server.jobs.interface import JobQueue, JobQueueUnavailableError

DEPENDENCIES = ("database", "blob_store", "job_queue")


@dataclass(frozen=True)
class Failure:
    dependency: str  # one of DEPENDENCIES
    problem: str
    fix: str


def check_database(session: Session) -> Failure | None:
    try:
        session.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        session.rollback()
        return Failure("database", f"database unreachable: {e.__class__.__name__}",
                       "check MODELFLEET_DATABASE_URL and that the database is up")
    return None


def check_blob_store(store: BlobStore) -> Failure | None:
    try:
        store.check_ready()
    except BlobStoreError as e:
        return Failure("blob_store", f"blob store not usable: {e}",
                       "check MODELFLEET_BLOB_STORE and MODELFLEET_BLOB_DIR (local: the "
                       "directory exists and is writable) or MODELFLEET_S3_* (the bucket "
                       "exists and the credentials may use it)")
    return None


def check_job_queue(queue: JobQueue) -> Failure | None:
    probe = getattr(queue, "check_ready", None)  # queues without one have nothing to fail
    if probe is None:
        return None
    try:
        probe()
    except JobQueueUnavailableError as e:
        return Failure("job_queue", f"job queue not usable: {e}",
                       "check MODELFLEET_JOB_BACKEND and, for procrastinate, that "
                       "MODELFLEET_DATABASE_URL reaches PostgreSQL")
    return None


def check_ready(session: Session, store: BlobStore, queue: JobQueue) -> dict[str, str]:
    """{dependency: "ok"} for all three, or ServiceUnavailableError naming each failure."""
    failures = [f for f in (check_database(session), check_blob_store(store),
                            check_job_queue(queue)) if f is not None]
    if failures:
        raise ServiceUnavailableError(
            "not ready: " + "; ".join(f"{f.dependency}: {f.problem}" for f in failures),
            field=failures[0].dependency, fix="; ".join(f.fix for f in failures))
    return dict.fromkeys(DEPENDENCIES, "ok")
