"""A version's compile builds: reading them with their artifacts, and re-queueing the failed
ones (transitions, audit, commit, then the job queue)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db import audit, versions
from server.db.models import Artifact, Build, BuildState, ModelVersion
from server.jobs.interface import JobQueue
from server.services import registry


@dataclass(frozen=True)
class BuildWithArtifacts:
    build: Build
    artifacts: list[Artifact]  # what the build produced, by platform and variant


@dataclass(frozen=True)
class VersionBuilds:
    model: str  # the name as asked for
    version: ModelVersion
    builds: list[BuildWithArtifacts]  # by platform and variant


def version_builds(session: Session, model: str, version: str) -> VersionBuilds:
    """NotFoundError if the model or version does not exist."""
    v = registry.get_version(session, model, version)
    builds = session.scalars(select(Build).where(Build.version_id == v.id)
                             .order_by(Build.platform, Build.variant))
    arts = list(session.scalars(select(Artifact).where(Artifact.version_id == v.id)
                                .order_by(Artifact.platform, Artifact.variant)))
    return VersionBuilds(model, v, [BuildWithArtifacts(b, [a for a in arts if a.build_id == b.id])
                             for b in builds])


def retry_failed(session: Session, queue: JobQueue, model: str, version: str, *,
                 actor: str) -> VersionBuilds:
    """Re-queues every failed build of the version; idempotent (no failed build: no change).
    The version returns to `compiling` so clients polling see it is being rebuilt."""
    v = registry.get_version(session, model, version)
    failed = list(session.scalars(select(Build).where(Build.version_id == v.id,
                                                      Build.state == BuildState.failed)))
    for b in failed:
        b.transition(BuildState.queued)
        b.next_attempt_at, b.locked_by = None, None
        b.log = (b.log or "") + "--- re-queued by " + actor + "\n"
    if failed:  # clients polling see it is being rebuilt
        versions.begin_compiling(session, v.id)
    if failed:
        audit.record(session, actor, "builds.retry", f"{model}/{v.version}",
                     builds=[f"{b.platform}/{b.variant}" for b in failed])
    session.commit()
    if failed:
        queue.enqueue_compile(v.id)
    return version_builds(session, model, version)
