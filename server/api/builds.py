"""`GET /v1/models/{name}/versions/{version}/builds`: compile builds with gates and logs.

One entry per build (platform × shape variant), each with its `state`, the primary
`artifact` (`sha256`, `length`, `compressed` — the smaller copy devices download, or null —
…), every artifact it produced (several for QNN with more
than one SoC target), the `gates` report (operator findings naming operators / inputs,
numeric metrics or "not run" with the reason) and the per-job `log`.
`POST …/builds/retry` re-queues the failed builds of a version (e.g. after a worker fix).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel

from server.api.deps import JobQueueDep, PublishPrincipal, SessionDep, StrictQuery
from server.api.errors import AUTH_ERRORS, NOT_FOUND
from server.api.models import ModelName
from server.db.models import Build, BuildState, VersionState
from server.services.builds import VersionBuilds, retry_failed, version_builds

router = APIRouter(prefix="/v1/models/{name}/versions/{version}/builds", tags=["builds"],
                   dependencies=[StrictQuery])


class CompressedPublic(BaseModel):
    """The compressed copy the manifest offers beside the artifact (manifests/compressed.py):
    what a device that takes it downloads instead of `length` bytes."""
    codec: str
    sha256: str
    length: int


class ArtifactPublic(BaseModel):
    platform: str
    variant: str
    format: str
    sha256: str
    length: int
    target: dict[str, Any]
    compile_settings: dict[str, Any]
    compressed: CompressedPublic | None = None


class BuildEntry(BaseModel):
    platform: str
    variant: str  # the shape variant this build compiled
    state: BuildState
    attempts: int
    artifact: ArtifactPublic | None
    artifacts: list[ArtifactPublic]
    gates: dict[str, Any] | None
    error: str
    log: str | None
    started_at: datetime | None
    finished_at: datetime | None
    next_attempt_at: datetime | None


class BuildList(BaseModel):
    model: str
    version: str
    state: VersionState
    builds: list[BuildEntry]


def _compressed(a: Any) -> CompressedPublic | None:
    if a.compressed_sha256 is None or a.compressed_length is None:
        return None
    return CompressedPublic(codec=a.compressed_codec or "", sha256=a.compressed_sha256,
                            length=a.compressed_length)


def _gates(build: Build) -> dict[str, Any] | None:
    """The primary outcome's gates; every outcome's when a build produced several."""
    report = build.gates_report
    if not report:
        return None
    outcomes = report.get("outcomes", [])
    if not outcomes:
        return report
    gates: dict[str, Any] = dict(outcomes[0].get("gates", {}))
    if len(outcomes) > 1:
        gates["by_artifact"] = {o["variant"]: o.get("gates", {}) for o in outcomes}
    return gates


def build_list(found: VersionBuilds, *, logs: bool) -> BuildList:
    """The response shape of a version's builds (also `modelfleet builds --json`)."""
    entries = []
    for item in found.builds:
        b = item.build
        mine = [ArtifactPublic(platform=a.platform, variant=a.variant, format=a.format,
                               sha256=a.sha256, length=a.length, target=a.target,
                               compile_settings=a.compile_settings,
                               compressed=_compressed(a)) for a in item.artifacts]
        entries.append(BuildEntry(
            platform=b.platform, variant=b.variant, state=b.state, attempts=b.attempts,
            artifact=mine[0] if mine and b.state == BuildState.succeeded else None,
            artifacts=mine, gates=_gates(b), error=b.error, log=b.log if logs else None,
            started_at=b.started_at, finished_at=b.finished_at,
            next_attempt_at=b.next_attempt_at))
    v = found.version
    return BuildList(model=found.model, version=v.version, state=v.state, builds=entries)


@router.get("", responses={**NOT_FOUND})
def list_builds(
    name: ModelName,
    version: Annotated[str, Path(min_length=1, max_length=64)],
    session: SessionDep,
    logs: Annotated[bool, Query(description="include each build's log")] = True,
) -> list[BuildEntry]:
    """Every build of a version (one entry per platform and shape variant) with its
    artifact(s), gate report and log. The version's own state: GET …/versions/{version}."""
    return build_list(version_builds(session, name, version), logs=logs).builds


@router.post("/retry", responses={**AUTH_ERRORS, **NOT_FOUND})
def retry_failed_builds(
    name: ModelName,
    version: Annotated[str, Path(min_length=1, max_length=64)],
    session: SessionDep,
    queue: JobQueueDep,
    principal: PublishPrincipal,
) -> BuildList:
    """Re-queues every failed build of the version (scope `publish`); idempotent: with no
    failed build nothing changes. The version returns to `compiling` when a worker starts."""
    return build_list(retry_failed(session, queue, name, version, actor=principal.actor),
                      logs=False)
