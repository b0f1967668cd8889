"""Garbage collection of uploaded source files that no version names.

An upload stores its files under fresh `sources/<model>/<version>/<token>/<field>` keys
before the version's row commits (server/services/registry.py); a process killed between the
two (crash point `upload.blobs_written`) leaves blobs no row will ever name: the client's
retry stores its files under new tokens. `collect_sources` deletes such blobs once they are
older than a grace period.

Why an upload in flight never loses its files: the keys are listed first and the rows read
after, so an upload that commits before the read is seen; one that has not committed yet
wrote its blobs less than the grace period ago (the period must exceed the longest upload,
from its first stored file to its commit: a day by default). A blob whose age the store cannot
tell is kept. One blob that cannot be read or deleted never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.blobstore import BlobNotFoundError, BlobStore, BlobStoreError
from server.blobstore.keys import SOURCES_PREFIX
from server.db import audit
from server.db.models import SourceUpload

log = logging.getLogger(__name__)


@dataclass
class SourceGcReport:
    deleted: list[str] = field(default_factory=list)  # orphans removed (or, dry run, due)
    young: list[str] = field(default_factory=list)  # orphans inside the grace period, kept
    referenced: int = 0  # blobs a source row names, kept
    failed: list[str] = field(default_factory=list)  # could not be read or deleted


def collect_sources(factory: sessionmaker[Session], store: BlobStore, *, now: float,
                    grace_seconds: float, dry_run: bool = False) -> SourceGcReport:
    """Deletes every blob under sources/ that no `source_uploads` row names and that was
    written more than `grace_seconds` before `now` (POSIX seconds). The deletions are
    audited as one `sources.gc` event."""
    keys = list(store.list_keys(SOURCES_PREFIX))  # before the rows: see the module docstring
    with factory() as session:
        named = set(session.scalars(select(SourceUpload.blob_key)))
    report = SourceGcReport()
    for key in keys:
        if key in named:
            report.referenced += 1
            continue
        try:
            modified = store.stat(key).modified
            if modified is None or now - modified < grace_seconds:
                report.young.append(key)
                continue
            if not dry_run:
                store.delete(key)
        except BlobNotFoundError:
            continue  # deleted meanwhile (another replica's pass)
        except BlobStoreError as e:
            log.warning("source GC: %s: %s", key, e)
            report.failed.append(key)
            continue
        report.deleted.append(key)
    if report.deleted and not dry_run:
        with factory() as session:
            audit.record(session, "system", "sources.gc", "sources",
                         count=len(report.deleted), keys=report.deleted[:100])
            session.commit()
        log.info("source GC deleted %d orphaned upload blob(s)", len(report.deleted))
    return report


async def source_gc_loop(factory: sessionmaker[Session], store: BlobStore, *,
                         grace_seconds: float, interval_seconds: float,
                         clock: Callable[[], float] = time.time) -> None:
    """`collect_sources` at start and every `interval_seconds` after (until cancelled),
    logging and surviving failures. Every API replica runs it; passes racing each other
    delete the same orphans, which is harmless."""
    while True:
        try:
            await asyncio.to_thread(collect_sources, factory, store, now=clock(),
                                    grace_seconds=grace_seconds)
        except Exception:  # the store or the database is down: the next pass retries
            log.exception("source GC failed; retrying in %.0f s", interval_seconds)
        await asyncio.sleep(interval_seconds)
