"""Runs one delta-patch job durably: claim it in the database, make the patches, re-sign.

The job is the `patch_jobs` row of a version (one per version), written by
`request_patches` when a rollout starts. Every queue backend (in-process thread,
procrastinate workers) drives it through `PatchRunner`, with the rules `BuildRunner` uses:

- Claimed with one conditional UPDATE (queued and due, or running with a heartbeat older
  than `stale_after_s` — its worker died), so two workers never both own it; the owner
  heartbeats while it works, for at most `max_job_s`.
- The work is `server.publish.patches.patch_and_republish`: patches are stored and recorded
  per artifact, a pair that already has a patch is skipped and the pair's unique constraint
  turns a racing duplicate into a no-op — so a retry or a duplicate job never adds a second
  row. A retried attempt always re-signs (the one that stored the patches may have died
  before re-signing).
- Any failure but a bad input (`DeltaInputError`) is retried with exponential backoff until
  `RetryPolicy.max_attempts`; then the job is `failed` with its reason. Releases still ship:
  devices download the full artifact.
- A request arriving while the job runs is counted (`requests`); the run then ends queued
  instead of done, so patches from newly published bases are not missed.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from server.db.models import Artifact, Patch, PatchJob, PatchJobState
from server.db.types import utcnow
from server.delta import DeltaPolicy
from server.delta.errors import DeltaInputError
from server.jobs.runner import RetryPolicy, claimable
from server.publish.patches import patch_and_republish
from server.publish.publisher import Publisher

log = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000


def request_patches(session_factory: sessionmaker[Session], version_id: int) -> None:
    """Records that `version_id` needs its patches made (idempotent: one row per version).

    A finished job (done or failed) is queued again from scratch; a queued or running one
    only counts the request."""
    now = utcnow()
    with session_factory() as s:
        insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
        created = s.execute(insert(PatchJob).values(
            version_id=version_id, state=PatchJobState.queued, attempts=0, requests=1,
            requests_claimed=0, patches_added=0, error="", created_at=now, updated_at=now,
        ).on_conflict_do_nothing(index_elements=["version_id"]).returning(PatchJob.id))
        if created.scalar() is None:  # the version already has its row
            s.execute(update(PatchJob).where(
                PatchJob.version_id == version_id,
                PatchJob.state.in_([PatchJobState.done, PatchJobState.failed])).values(
                state=PatchJobState.queued, attempts=0, next_attempt_at=None, error="",
                updated_at=now).execution_options(synchronize_session=False))
            s.execute(update(PatchJob).where(PatchJob.version_id == version_id).values(
                requests=PatchJob.requests + 1).execution_options(synchronize_session=False))
        s.commit()


class PatchRunner:
    def __init__(self, session_factory: sessionmaker[Session],
                 publisher: Callable[[], Publisher], *, worker_id: str,
                 policy: DeltaPolicy | None = None, retry: RetryPolicy | None = None,
                 heartbeat_s: float = 5.0, stale_after_s: float = 120.0,
                 max_job_s: float = 3600.0,
                 on_published: Callable[[str], None] | None = None) -> None:
        self._sf = self.session_factory = session_factory
        self._publisher = publisher  # called per job: made lazily, key read at each publish
        self.worker_id = worker_id
        self.policy = policy or DeltaPolicy()
        self.retry = retry or RetryPolicy()
        self._heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.max_job_s = max_job_s
        self.on_published = on_published

    # ---- claiming ------------------------------------------------------------------------

    def _claimable(self, now: datetime) -> Any:
        return claimable(PatchJob, PatchJobState.queued, PatchJobState.running, now,
                         self.stale_after_s)

    def claim(self, version_id: int) -> bool:
        now = utcnow()
        with self._sf() as s:
            claimed = s.scalar(update(PatchJob).where(
                PatchJob.version_id == version_id, self._claimable(now)).values(
                state=PatchJobState.running, locked_by=self.worker_id, heartbeat_at=now,
                started_at=now, finished_at=None, next_attempt_at=None,
                attempts=PatchJob.attempts + 1, requests_claimed=PatchJob.requests,
                updated_at=now).returning(PatchJob.id)
                .execution_options(synchronize_session=False))
            s.commit()
            return claimed is not None

    def claimable_ids(self, limit: int = 10) -> list[int]:
        """Version ids whose patch job is due (or abandoned by a dead worker)."""
        with self._sf() as s:
            return list(s.scalars(select(PatchJob.version_id).where(self._claimable(utcnow()))
                                  .order_by(PatchJob.id).limit(limit)))

    def next_wakeup(self) -> float | None:
        with self._sf() as s:
            at = s.scalar(select(PatchJob.next_attempt_at).where(
                PatchJob.state == PatchJobState.queued, PatchJob.next_attempt_at.is_not(None))
                .order_by(PatchJob.next_attempt_at).limit(1))
        return None if at is None else max((at - utcnow()).total_seconds(), 0.0)

    def process(self, version_id: int) -> bool:
        """Claims and runs the version's patch job; False if owned elsewhere or not due."""
        if not self.claim(version_id):
            return False
        self.run_claimed(version_id)
        return True

    # ---- running -------------------------------------------------------------------------

    def _heartbeat(self, version_id: int, stop: threading.Event) -> None:
        started = time.monotonic()
        while not stop.wait(self._heartbeat_s):
            if time.monotonic() - started > self.max_job_s:
                log.error("patch job of version %s exceeded %.0fs; no longer heartbeating so "
                          "another worker can take it over", version_id, self.max_job_s)
                return
            try:
                with self._sf() as s:
                    s.execute(update(PatchJob).where(
                        PatchJob.version_id == version_id,
                        PatchJob.locked_by == self.worker_id,
                        PatchJob.state == PatchJobState.running).values(heartbeat_at=utcnow())
                        .execution_options(synchronize_session=False))
                    s.commit()
            except Exception:  # a missed beat only risks a takeover, which is harmless
                log.warning("heartbeat of patch job %s failed", version_id, exc_info=True)

    def run_claimed(self, version_id: int) -> None:
        with self._sf() as s:
            attempts = s.scalar(select(PatchJob.attempts).where(
                PatchJob.version_id == version_id)) or 1
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(version_id, stop), daemon=True,
                                name=f"patch-heartbeat-{version_id}")
        beat.start()
        try:
            published = patch_and_republish(self._sf, self._publisher(), version_id,
                                             policy=self.policy, republish=attempts > 1)
        except DeltaInputError as e:
            log.error("patch job of version %s failed: %s", version_id, e)
            self._settle(version_id, error=str(e), retry=False)
        except Exception as e:
            log.warning("patch job of version %s attempt %d failed:\n%s", version_id, attempts,
                        traceback.format_exc())
            self._settle(version_id, error=f"{type(e).__name__}: {e}", retry=True)
        else:
            self._settle(version_id, error=None, retry=False)
            for manifest in published:
                if self.on_published is not None:
                    self.on_published(manifest.channel)
        finally:
            stop.set()
            beat.join(timeout=5)

    def _settle(self, version_id: int, *, error: str | None, retry: bool) -> None:
        with self._sf() as s:
            job = s.execute(select(PatchJob).where(PatchJob.version_id == version_id)
                            .with_for_update()).scalar_one_or_none()
            if job is None or job.locked_by != self.worker_id or \
                    job.state != PatchJobState.running:
                return  # lost the claim; the new owner settles the job
            now = utcnow()
            job.locked_by, job.finished_at, job.updated_at = None, now, now
            job.patches_added = s.scalar(
                select(func.count(Patch.id)).join(Artifact, Artifact.id == Patch.to_artifact_id)
                .where(Artifact.version_id == version_id)) or 0
            if error is None:
                job.error = ""
                if job.requests > job.requests_claimed:  # asked again while running
                    job.state, job.attempts = PatchJobState.queued, 0
                else:
                    job.state = PatchJobState.done
            elif retry and job.attempts < self.retry.max_attempts:
                job.error = error[:MAX_ERROR_CHARS]
                job.state = PatchJobState.queued
                job.next_attempt_at = now + timedelta(seconds=self.retry.delay(job.attempts))
            else:
                suffix = f" (gave up after {job.attempts} attempts)" if retry else ""
                job.error = (error + suffix)[:MAX_ERROR_CHARS]
                job.state = PatchJobState.failed
            s.commit()
