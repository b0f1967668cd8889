"""The seam between the API and background jobs: what an upload (compile) or a rollout start
(delta patches) calls once its transaction committed.

The registry holds a `JobQueue` on `app.state.job_queue`; the compile area swaps in its own
implementation (in-process or procrastinate). `NullJobQueue` records the calls and does
nothing else — the default until a real queue is wired, and handy in tests.

A queue may also offer `check_ready() -> None` raising JobQueueUnavailableError (readiness,
server/services/readiness.py); one without it has nothing that can fail on its own.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class JobQueueUnavailableError(Exception):
    """A queue's optional `check_ready()` (GET /readyz) found it unusable; says why."""


@runtime_checkable
class JobQueue(Protocol):
    def enqueue_compile(self, version_id: int) -> None:
        """Schedules compiling every queued build of the model version `version_id`.

        Called after the upload transaction committed; must be idempotent (a retried upload
        may call it again) and must not raise for a transient backend problem it can retry."""
        ...

    def enqueue_patches(self, version_id: int) -> None:
        """Schedules making the delta patches to `version_id`'s artifacts (from the last K
        published artifacts of each) and re-signing the channels that offer it.

        Called after a rollout of the version started (its first job was recorded when its
        builds finished, before it turned ready: this catches bases published since);
        idempotent (a second call never yields a second patch for a pair). Raises only if the
        request could not be recorded in the database; the release is served in full
        meanwhile."""
        ...


class NullJobQueue:
    """Accepts jobs and runs none; `enqueued` / `patches_enqueued` list the version ids it
    was given."""

    def __init__(self) -> None:
        self.enqueued: list[int] = []
        self.patches_enqueued: list[int] = []

    def enqueue_compile(self, version_id: int) -> None:
        self.enqueued.append(version_id)

    def enqueue_patches(self, version_id: int) -> None:
        self.patches_enqueued.append(version_id)
