"""The one place a model version's state changes after its upload created it `uploaded`:

    uploaded ──(a worker claims a build)──▶ compiling ──(every build finished)──▶ ready | failed
    compiling ──(every build succeeded, and it has patch bases)──▶ patching ──(patch job
        settled: made or failed)──▶ ready
    failed ──(a worker claims a re-queued build, or the failed builds are retried)──▶ compiling

The version follows its builds: ready when every build succeeded, failed when all finished
and any failed (its error lists theirs). A version with earlier published versions to patch
from passes through `patching` first (the caller, server/jobs/runner.py, decides and records
the patch job in the same transaction), so the first manifest offering it lists its patches.
Each function takes the version's row lock.
"""

from __future__ import annotations

from collections.abc import Callable

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


def settle(s: Session, version_id: int, *,
           patch_first: Callable[[Session, int], bool] | None = None) -> VersionState:
    """ready when every build succeeded, failed when all finished and any failed; unchanged
    while a build is queued or running. With `patch_first`, a version whose builds all
    succeeded becomes `patching` instead of ready when `patch_first(s, version_id)` is true
    (it has patch bases and recorded its patch job). Returns the version's state."""
    s.flush()
    version = _locked(s, version_id)
    if version.state in (VersionState.patching, VersionState.ready):
        return version.state  # a late duplicate settle: its builds are all done already
    states = [b.state for b in s.scalars(select(Build).where(Build.version_id == version_id))]
    if any(st in (BuildState.queued, BuildState.running) for st in states):
        return version.state
    target = VersionState.ready if all(st == BuildState.succeeded for st in states) \
        else VersionState.failed
    if target is VersionState.ready and patch_first is not None \
            and patch_first(s, version_id):
        target = VersionState.patching
    if version.state == VersionState.uploaded:
        version.transition(VersionState.compiling)
    if version.state != target:
        version.transition(target)
    if target is VersionState.failed:
        failed = s.scalars(select(Build).where(Build.version_id == version_id,
                                               Build.state == BuildState.failed))
        version.error = "; ".join(f"{b.platform}/{b.variant}: {b.error}"
                                  for b in failed)[:MAX_ERROR_CHARS]
    return version.state


def finish_patching(s: Session, version_id: int) -> bool:
    """A `patching` version is ready: its patch job made its patches or failed (a failed
    job never holds a release back). True if it changed; any other state is left alone."""
    version = _locked(s, version_id)
    if version.state is not VersionState.patching:
        return False
    version.transition(VersionState.ready)
    return True
