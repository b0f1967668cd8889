"""The seam between the registry and compile jobs: what an upload calls once it committed.

The registry holds a `JobQueue` on `app.state.job_queue`; the compile area swaps in its own
implementation (in-process or procrastinate). `NullJobQueue` records the calls and does
nothing else — the default until a real queue is wired, and handy in tests.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class JobQueue(Protocol):
    def enqueue_compile(self, version_id: int) -> None:
        """Schedules compiling every queued build of the model version `version_id`.

        Called after the upload transaction committed; must be idempotent (a retried upload
        may call it again) and must not raise for a transient backend problem it can retry."""
        ...


class NullJobQueue:
    """Accepts jobs and runs none; `enqueued` lists the version ids it was given."""

    def __init__(self) -> None:
        self.enqueued: list[int] = []

    def enqueue_compile(self, version_id: int) -> None:
        self.enqueued.append(version_id)
