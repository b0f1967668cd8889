"""Starting a rollout in tests that drive the rollout service directly: no job queue runs
there, so the delta-patch request a start makes goes to a `NullJobQueue` (which records it)."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from server.jobs.interface import JobQueue, NullJobQueue
from server.publish.publisher import Publisher
from server.rollouts import service as ro


def start_rollout(factory: sessionmaker[Session], pub: Publisher, channel: str,
                  spec: ro.RolloutSpec, *, actor: str,
                  patches: JobQueue | None = None) -> ro.RolloutView:
    return ro.start_rollout(factory, pub, channel, spec, actor=actor,
                            patches=NullJobQueue() if patches is None else patches)
