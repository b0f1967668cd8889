"""Runs one delta-patch job durably: claim it in the database, make the patches, re-sign.

The job is the `patch_jobs` row of a version (one per version), written when its last
build succeeds and it has published versions to patch from (`patch_before_ready`, called by
`server.db.versions.settle` in the build's own transaction: the version is `patching` until
the job settles, then `ready`), and again by `request_patches` when a rollout starts (bases
published since). Every queue backend (in-process thread,
procrastinate workers) drives it through `PatchRunner`, leased like a build
(`server.jobs.lease`):

- Claimed with one conditional UPDATE (queued and due, or running with a heartbeat older
  than `stale_after_s` — its worker died), so two workers never both own it; the owner
  heartbeats while it works, for at most `max_job_s`. State changes are checked
  (`PATCH_JOB_TRANSITIONS`).
- The work is `server.publish.patches.patch_and_republish`: patches are stored and recorded
  per artifact, a pair that already has a patch is skipped and the pair's unique constraint
  turns a racing duplicate into a no-op — so a retry or a duplicate job never adds a second
  row. A retried attempt always re-signs (the one that stored the patches may have died
  before re-signing).
- Any failure but a bad input (`DeltaInputError`) is retried with exponential backoff until
  `RetryPolicy.max_attempts`; then the job is `failed` with its reason. Releases still ship:
  the first failed attempt already makes a `patching` version ready (devices download in
  full; the error stays on the job row, shown with the version), and a later attempt that
  succeeds re-signs the channels offering it.
- A request arriving while the job runs is counted (`requests`); the run then ends queued
  instead of done, so patches from newly published bases are not missed.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from server import crashpoints
from server.db import audit, versions
from server.db.models import Artifact, Patch, PatchJob, PatchJobState
from server.db.types import utcnow
from server.delta import DeltaPolicy
from server.delta.errors import DeltaInputError
from server.jobs.lease import Lease, RetryPolicy
from server.observability.metrics import PATCH_JOBS
from server.publish.patches import patch_and_republish, patch_bases
from server.publish.publisher import Publisher

log = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000


def request_patches(session_factory: sessionmaker[Session], version_id: int) -> None:
    """Records that `version_id` needs its patches made (idempotent: one row per version).

    A finished job (done or failed) is queued again from scratch; a queued or running one
    only counts the request."""
    with session_factory() as s:
        record_patch_request(s, version_id)
        s.commit()


def record_patch_request(s: Session, version_id: int) -> None:
    """`request_patches` inside the caller's transaction (it commits)."""
    now = utcnow()
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


def patch_before_ready(k: int) -> Callable[[Session, int], bool]:
    """`settle`'s `patch_first`: if any artifact of the version has a published base (the
    `k` that `patch_bases` picks), records the version's patch job in the caller's
    transaction and answers True (the version waits in `patching`); else False (ready now:
    nothing to patch from)."""

    def patch_first(s: Session, version_id: int) -> bool:
        artifacts = s.scalars(select(Artifact).where(Artifact.version_id == version_id))
        if not any(patch_bases(s, art, k) for art in artifacts):
            return False
        record_patch_request(s, version_id)
        return True

    return patch_first


class PatchRunner:
    def __init__(self, session_factory: sessionmaker[Session], publisher: Publisher, *,
                 worker_id: str,
                 policy: DeltaPolicy | None = None, retry: RetryPolicy | None = None,
                 heartbeat_s: float = 5.0, stale_after_s: float = 120.0,
                 max_job_s: float = 3600.0, now: Callable[[], datetime] = utcnow) -> None:
        self._sf = self.session_factory = session_factory
        self._publisher = publisher  # its signer reads the release key at each publish
        self.worker_id = worker_id
        self.policy = policy or DeltaPolicy()
        self.lease: Lease[PatchJob, PatchJobState] = Lease(
            session_factory, PatchJob, PatchJob.version_id, queued=PatchJobState.queued,
            running=PatchJobState.running, worker_id=worker_id, retry=retry,
            heartbeat_s=heartbeat_s, stale_after_s=stale_after_s, max_run_s=max_job_s, now=now)
        self.retry = self.lease.retry

    # ---- claiming ------------------------------------------------------------------------

    def claim(self, version_id: int) -> bool:
        with self._sf() as s:  # the claim snapshots the request count it will satisfy
            claimed = self.lease.claim(s, version_id, requests_claimed=PatchJob.requests)
            s.commit()
            return claimed

    def claimable_ids(self, limit: int = 10) -> list[int]:
        """Version ids whose patch job is due (or abandoned by a dead worker)."""
        return self.lease.claimable_keys(limit)

    def next_wakeup(self) -> float | None:
        return self.lease.next_wakeup()

    def process(self, version_id: int) -> bool:
        """Claims and runs the version's patch job; False if owned elsewhere or not due."""
        if not self.claim(version_id):
            return False
        self.run_claimed(version_id)
        return True

    # ---- running -------------------------------------------------------------------------

    def run_claimed(self, version_id: int) -> None:
        with self._sf() as s:
            attempts = s.scalar(select(PatchJob.attempts).where(
                PatchJob.version_id == version_id)) or 1
        try:
            with self.lease.heartbeat(version_id):
                patch_and_republish(self._sf, self._publisher, version_id,
                                    policy=self.policy, republish=attempts > 1)
                crashpoints.reached("patch.republished")
        except DeltaInputError as e:
            log.error("patch job of version %s failed: %s", version_id, e)
            self._settle(version_id, error=str(e), retry=False)
        except Exception as e:
            log.warning("patch job of version %s attempt %d failed:\n%s", version_id, attempts,
                        traceback.format_exc())
            self._settle(version_id, error=f"{type(e).__name__}: {e}", retry=True)
        else:
            # Each re-publish reached the manifest cache through the publisher's event.
            self._settle(version_id, error=None, retry=False)

    def _settle(self, version_id: int, *, error: str | None, retry: bool) -> None:
        with self._sf() as s:
            job = self.lease.owned(s, version_id)
            if job is None:
                return  # lost the claim; the new owner settles the job
            job.patches_added = s.scalar(
                select(func.count(Patch.id)).join(Artifact, Artifact.id == Patch.to_artifact_id)
                .where(Artifact.version_id == version_id)) or 0
            if error is None:
                outcome = "done"
                if job.requests > job.requests_claimed:  # asked again while running
                    self.lease.finish(job, PatchJobState.queued)
                    job.attempts = 0
                else:
                    self.lease.finish(job, PatchJobState.done)
            elif retry and self.lease.may_retry(job):
                outcome = "retried"
                self.lease.back_off(job, error[:MAX_ERROR_CHARS])
            else:
                outcome = "failed"
                suffix = f" (gave up after {job.attempts} attempts)" if retry else ""
                self.lease.finish(job, PatchJobState.failed, (error + suffix)[:MAX_ERROR_CHARS])
            # A version waiting for its patches is released by this attempt, made or failed:
            # retries (or a request that came in meanwhile) go on, and one that adds patches
            # re-signs the channels offering the version by then.
            if versions.finish_patching(s, version_id) and error is not None:
                audit.record(s, "system", "patches.failed", f"version:{version_id}",
                             error=error[:MAX_ERROR_CHARS], fallback="full download")
            s.commit()
        PATCH_JOBS.labels(outcome).inc()
