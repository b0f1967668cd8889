"""The one place a model version's state changes after its upload created it `uploaded`:

    uploaded ──(a worker claims a build)──▶ compiling ──(every build finished)──▶ ready | failed
    failed ──(a worker claims a re-queued build, or the failed builds are retried)──▶ compiling

The version follows its builds: ready when every build succeeded, failed when all finished
and any failed (its error lists theirs). Each function takes the version's row lock.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db.models import Build, BuildState, ModelVersion, VersionState

MAX_ERROR_CHARS = 4000


def _locked(s: Session, version_id: int) -> ModelVersion:
    return s.execute(select(ModelVersion).where(ModelVersion.id == version_id)
                     .with_for_update()).scalar_one()


def begin_compiling(s: Session, version_id: int) -> ModelVersion:
    """An uploaded or failed version is compiling (again) from now on; its error is cleared."""
    version = _locked(s, version_id)
    if version.state in (VersionState.uploaded, VersionState.failed):
        version.transition(VersionState.compiling)
        version.error = ""
    return version


def settle(s: Session, version_id: int) -> None:
    """ready when every build succeeded, failed when all finished and any failed; unchanged
    while a build is queued or running."""
    s.flush()
    version = _locked(s, version_id)
    states = [b.state for b in s.scalars(select(Build).where(Build.version_id == version_id))]
    if any(st in (BuildState.queued, BuildState.running) for st in states):
        return
    target = VersionState.ready if all(st == BuildState.succeeded for st in states) \
        else VersionState.failed
    if version.state == VersionState.uploaded:
        version.transition(VersionState.compiling)
    if version.state != target:
        version.transition(target)
    if target is VersionState.failed:
        failed = s.scalars(select(Build).where(Build.version_id == version_id,
                                               Build.state == BuildState.failed))
        version.error = "; ".join(f"{b.platform}/{b.variant}: {b.error}"
                                  for b in failed)[:MAX_ERROR_CHARS]
