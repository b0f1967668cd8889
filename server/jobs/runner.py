"""Runs one compile build durably: claim it in the database, compile, store, record.

Every queue backend (in-process thread, procrastinate workers) drives builds through
`BuildRunner`, so both share the same durability rules:

- State lives in the `builds` row, leased like every job (`server.jobs.lease`): one
  conditional UPDATE claims it (queued, or running with a stale heartbeat — its worker died),
  and the owner heartbeats — publishing the log so far — for at most `max_build_s` (a hung
  compile then becomes claimable by another worker).
- Transient failures (`TransientCompileError`, blob backend errors) put the build back to
  queued with exponential backoff (`next_attempt_at`) until `max_attempts`; anything else
  fails the build with its reason. Gate failures are normal outcomes, not errors.
- Artifacts go to the blob store first (content-addressed keys), rows after; a final write
  happens only if this worker still owns the build, so a worker that lost its claim cannot
  overwrite the new owner.
- After each build the version's state is recomputed (`server.db.versions.settle`):
  uploaded → compiling → ready (every build succeeded) | failed (any build failed). A
  version whose artifacts have published bases goes to `patching` instead of ready, with
  its patch job recorded in the same transaction (`patch_runner.patch_before_ready`); the
  patch job's settling makes it ready — so a rollout started once it is ready is signed
  with its patches already listed.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from manifests import sealed
from server import crashpoints
from server.blobstore.interface import BlobBackendError, BlobStore
from server.blobstore.keys import unmarked_key
from server.compile.cohorts import WatermarkSpec
from server.compile.errors import CompileError, TransientCompileError
from server.compile.pipeline import BuildOutcome, BuildSpec
from server.compile.sandbox import Builder
from server.compile.settings_map import pipeline_settings
from server.compile.types import InputSpec, SourceFormat
from server.db import versions
from server.db.models import (
    Artifact,
    Build,
    BuildState,
    CohortArtifact,
    Model,
    ModelVersion,
    SourceUpload,
    UploadKind,
)
from server.db.types import utcnow
from server.delta import DeltaPolicy
from server.hashing import file_sha256
from server.jobs import search_budget
from server.jobs.lease import Lease, RetryPolicy, public_worker_name
from server.jobs.patch_runner import patch_before_ready
from server.observability.metrics import BUILD_JOBS
from server.publish.bucket import store_artifact
from server.publish.copies import compress_copy
from server.publish.protection import ContentKeys, SealedFile, WatermarkSecret, seal_file

__all__ = ["BuildRunner", "RetryPolicy", "wait_for"]

log = logging.getLogger(__name__)
MAX_LOG_CHARS = 64 * 1024


class _JobLog:
    """Timestamped lines for `builds.log`, capped so a chatty compile cannot bloat the row."""

    def __init__(self, previous: str = "") -> None:
        self.previous = previous  # earlier attempts' lines, kept above this attempt's
        self.lines: list[str] = []
        self._size = 0

    def __call__(self, msg: str) -> None:
        line = f"{utcnow().strftime('%H:%M:%S')} {msg}"
        if self._size + len(line) > MAX_LOG_CHARS:
            if not self.lines or not self.lines[-1].endswith("[log truncated]"):
                self.lines.append("[log truncated]")
            return
        self._size += len(line) + 1
        self.lines.append(line)

    def text(self) -> str:
        return (self.previous + "\n".join(self.lines) + "\n")[-MAX_LOG_CHARS:]


class BuildRunner:
    def __init__(self, session_factory: sessionmaker[Session], store: BlobStore, *,
                 worker_id: str,
                 pipeline_factory: Callable[[Callable[[str], None]], Builder],
                 work_root: Path | None = None,
                 retry: RetryPolicy | None = None, heartbeat_s: float = 5.0,
                 stale_after_s: float = 120.0, max_build_s: float = 3600.0,
                 patch_policy: DeltaPolicy | None = None,
                 content_keys: ContentKeys | None = None,
                 watermark: WatermarkSecret | None = None,
                 now: Callable[[], datetime] = utcnow) -> None:
        self._watermark = watermark  # watermarked versions: each release's derived key
        self._sf = session_factory
        self._content_keys = content_keys  # protected versions: unseal sources, seal artifacts
        # Which bases count (the K of patch_bases) when deciding a version must patch first.
        self._patch_first = patch_before_ready((patch_policy or DeltaPolicy()).k)
        self._store = store
        self.worker_id = worker_id
        self._work_root = work_root
        # No default: the wiring chooses (server/wiring.py `sandboxed_builds`, the sandbox
        # with the deployment's limits), so no runner builds a sandbox of its own.
        self._pipeline_factory = pipeline_factory
        # A compile still running after `max_build_s` is presumed hung: its heartbeat stops so
        # another worker can take the build over (this one's late result is then discarded).
        self.lease: Lease[Build, BuildState] = Lease(
            session_factory, Build, Build.id, queued=BuildState.queued,
            running=BuildState.running, worker_id=worker_id, retry=retry,
            heartbeat_s=heartbeat_s, stale_after_s=stale_after_s, max_run_s=max_build_s,
            now=now)
        self.retry = self.lease.retry

    # ---- claiming ------------------------------------------------------------------------

    def claim(self, build_id: int) -> bool:
        """Takes ownership of a queued (or abandoned running) build; False if not claimable."""
        with self._sf() as s:
            if not self.lease.claim(s, build_id):
                s.rollback()
                return False
            version_id = s.scalar(select(Build.version_id).where(Build.id == build_id))
            assert version_id is not None
            versions.begin_compiling(s, version_id)
            s.commit()
            return True

    def claimable_ids(self, limit: int = 10) -> list[int]:
        return self.lease.claimable_keys(limit)

    def next_wakeup(self) -> float | None:
        """Seconds until the earliest delayed retry is due (None if nothing is waiting)."""
        return self.lease.next_wakeup()

    def process(self, build_id: int) -> bool:
        """Claims and runs one build; False if someone else owns it or it is not due."""
        if not self.claim(build_id):
            return False
        self.run_claimed(build_id)
        return True

    # ---- running -------------------------------------------------------------------------

    def run_claimed(self, build_id: int) -> None:
        with self._sf() as s:  # the log shows every attempt; each beat publishes progress
            job_log = _JobLog(s.scalar(select(Build.log).where(Build.id == build_id)) or "")
        # The build log is readable without a token: an opaque name there, the worker's
        # host and pid only in the server's own log.
        label = public_worker_name(self.worker_id)
        log.info("build %d: attempt on worker %s (%s in the build log)", build_id,
                 self.worker_id, label)
        job_log(f"attempt started on worker {label}")
        work = Path(tempfile.mkdtemp(prefix=f"build-{build_id}-", dir=self._work_root))
        try:
            with self.lease.heartbeat(build_id, lambda: {"log": job_log.text()}):
                self._attempt(build_id, work, job_log)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _attempt(self, build_id: int, work: Path, job_log: _JobLog) -> None:
        try:
            spec, seal_key = self._prepare(build_id, work)
            outcomes = self._pipeline_factory(job_log).build(spec, work / "out")
            self._finish(build_id, seal_key, outcomes, job_log)
        except (TransientCompileError, BlobBackendError) as e:
            job_log(f"transient failure: {e}")
            self._retry_or_fail(build_id, str(e), job_log)
        except CompileError as e:
            job_log(f"failed: {e}")
            self._fail(build_id, str(e), job_log)
        except Exception as e:
            job_log(f"internal error: {type(e).__name__}: {e}")
            log.error("build %s crashed:\n%s", build_id, traceback.format_exc())
            self._fail(build_id, f"internal error: {type(e).__name__}: {e}", job_log)

    def _prepare(self, build_id: int, work: Path) -> tuple[BuildSpec, bytes | None]:
        with self._sf() as s:
            build = s.get(Build, build_id)
            assert build is not None
            version = s.get(ModelVersion, build.version_id)
            assert version is not None
            model = s.get(Model, version.model_id)
            assert model is not None
            task = model.task
            uploads = {u.kind: u for u in s.scalars(
                select(SourceUpload).where(SourceUpload.version_id == version.id))}
            meta = version.metadata_json
            inputs = tuple(InputSpec(name=i["name"], shape=tuple(i["shapes"][build.variant]),
                                     dtype=i.get("dtype", "float32"), value=i.get("value"))
                           for i in meta["inputs"])
            fmt = SourceFormat.parse(version.source_format)
            platform, settings = build.platform, dict(build.compile_settings or {})
            # The model's task decides which outputs the numeric gate checks top-k on.
            settings["task"] = task.value
            # precision auto: this build's share of the version's search budget.
            settings = search_budget.with_share(settings,
                                                search_budget.version_share(s, build))
            variant = build.variant
            marks = meta.get("watermark") or None
            watermark = None
            if marks:  # the sandbox gets this release's key only, never the secret
                if self._watermark is None:
                    raise CompileError("version is watermarked but this worker has no "
                                       "watermark secret (give it the keys directory)")
                watermark = WatermarkSpec(int(marks["cohorts"]), self._watermark.release_key(
                    model.name, version.version))
            seal_key = None
            if version.protected:
                if self._content_keys is None:
                    raise CompileError("version is protected but this worker has no content "
                                       "keys (give it the keys directory's content.kek)")
                seal_key = self._content_keys.key_for(s, version.id)
        paths: dict[UploadKind, Path] = {}
        suffix = {UploadKind.model: {"onnx": ".onnx", "pt2": ".pt2"}.get(
            version.source_format, ".pt"), UploadKind.calibration: ".npz",
            UploadKind.reference: ".npz"}
        for kind, up in uploads.items():
            dest = work / f"{kind.value}{suffix[kind]}"
            with self._store.open(up.blob_key) as src, dest.open("wb") as out:
                if seal_key is None:
                    shutil.copyfileobj(src, out, 1 << 20)
                else:  # a protected version's sources rest sealed too
                    for piece in sealed.unseal(seal_key, src):
                        out.write(piece)
            paths[kind] = dest
        spec = BuildSpec(
            source_path=paths[UploadKind.model], source_format=fmt,
            variants={variant: inputs}, platforms=(platform,),
            settings=pipeline_settings(platform, settings),
            calibration_path=paths.get(UploadKind.calibration),
            reference_path=paths.get(UploadKind.reference), watermark=watermark)
        return spec, seal_key

    def _store_file(self, path: Path, seal_key: bytes | None, key_for: Callable[[str], str] | None
               = None) -> tuple[str, str, int, SealedFile | None]:
        """(blob key, sha256, length, sealing) of one built file: sealed under `seal_key`
        when the version is protected; at its read key unless `key_for` names a private one."""
        done = None
        if seal_key is not None:  # gated in the clear; stored and served sealed
            sealed_path = path.with_name(path.name + ".sealed")
            with path.open("rb") as f, sealed_path.open("wb") as out:
                done = seal_file(seal_key, f, out)
            path = sealed_path
        sha, length = file_sha256(path)
        with path.open("rb") as f:
            if key_for is None:
                # Content-addressed, at its read key (v1/artifacts/<sha256>): a worker that
                # lost its claim can never overwrite the blob a newer owner recorded.
                key = store_artifact(self._store, sha, f)
            else:
                key = key_for(sha)
                self._store.put(key, f, max_bytes=length, expected_sha256=sha)
        return key, sha, length, done

    def _store_copy(self, path: Path, seal_key: bytes | None) -> Copy | None:
        """The compressed copy of one built file, stored like it (compressed, then sealed when
        protected: ciphertext does not compress), with its codec; None when compression saves
        too little."""
        copy = path.with_name(path.name + ".zst")
        made = compress_copy(path, copy)
        if made is None:
            return None
        try:
            return self._store_file(copy, seal_key), made[2]
        finally:
            copy.unlink(missing_ok=True)
            copy.with_name(copy.name + ".sealed").unlink(missing_ok=True)

    def _finish(self, build_id: int, seal_key: bytes | None, outcomes: list[BuildOutcome],
                job_log: _JobLog) -> None:
        stored: list[tuple[BuildOutcome, Stored, list[Stored], str | None,
                           list[Copy | None]]] = []
        for o in outcomes:
            if o.artifact is None:
                continue
            # A watermarked artifact is served only as its cohorts' copies (cohort 0's for
            # SDKs that predate cohorts); the unmarked one is kept privately, for identify.
            cohorts = [self._store_file(c.path, seal_key) for c in o.cohorts]
            unmarked = self._store_file(o.artifact.path, seal_key, unmarked_key)[0] \
                if cohorts else None
            main = cohorts[0] if cohorts else self._store_file(o.artifact.path, seal_key)
            # Compressed copies of what is served (each cohort's, or the artifact's).
            copies = [self._store_copy(p, seal_key)
                      for p in ([c.path for c in o.cohorts] or [o.artifact.path])]
            stored.append((o, main, cohorts, unmarked, copies))
            job_log(f"stored {o.platform}/{o.variant} as {main[0]}"
                    + (" (sealed)" if main[3] else "")
                    + (f", compressed copy ({copies[0][1]}) {copies[0][0][2]} of {main[2]} "
                       "bytes" if copies[0] else "")
                    + (f", {len(cohorts)} watermarked cohort copies, the unmarked one at "
                       f"{unmarked}" if cohorts else ""))
        crashpoints.reached("build.artifacts_stored")
        ok = bool(outcomes) and all(o.state == "ready" for o in outcomes)
        with self._sf() as s:
            build = self.lease.owned(s, build_id)
            if build is None:
                job_log("lost the claim to another worker; results discarded")
                return
            for o, main, cohorts, unmarked, copies in stored:
                row = s.scalar(select(Artifact).where(
                    Artifact.version_id == build.version_id, Artifact.platform == o.platform,
                    Artifact.variant == o.variant))
                if row is None:
                    row = Artifact(version_id=build.version_id, platform=o.platform,
                                   variant=o.variant)
                    s.add(row)
                assert o.artifact is not None
                key, sha, length, done = main
                row.build_id, row.format, row.blob_key = build.id, o.format, key
                row.sha256, row.length = sha, length
                row.plain_sha256, row.plain_length = _plain(done)
                row.target, row.compile_settings = o.target, o.compile_settings
                row.unmarked_blob_key = unmarked
                _set_copy(row, copies[0])
                row.cohorts = [CohortArtifact(cohort=c, blob_key=k, sha256=h, length=n,
                                              plain_sha256=_plain(d)[0],
                                              plain_length=_plain(d)[1])
                               for c, (k, h, n, d) in enumerate(cohorts)]
                for cohort_row, copy in zip(row.cohorts, copies, strict=False):
                    _set_copy(cohort_row, copy)
            build.gates_report = {"outcomes": [o.to_dict() for o in outcomes]}
            error = "" if ok else "; ".join(
                f"{o.variant}: {o.error}" for o in outcomes if o.state != "ready")[:4000]
            job_log("build succeeded" if ok else f"build failed: {error}")
            build.log = job_log.text()
            self.lease.finish(build, BuildState.succeeded if ok else BuildState.failed, error)
            versions.settle(s, build.version_id, patch_first=self._patch_first)
            s.commit()
        crashpoints.reached("build.settled")
        BUILD_JOBS.labels("succeeded" if ok else "failed").inc()

    def _fail(self, build_id: int, error: str, job_log: _JobLog) -> None:
        with self._sf() as s:
            build = self.lease.owned(s, build_id)
            if build is None:
                return
            build.log = job_log.text()
            self.lease.finish(build, BuildState.failed, error[:4000])
            versions.settle(s, build.version_id)
            s.commit()
        BUILD_JOBS.labels("failed").inc()

    def _retry_or_fail(self, build_id: int, error: str, job_log: _JobLog) -> None:
        with self._sf() as s:
            build = self.lease.owned(s, build_id)
            if build is None:
                return
            if not self.lease.may_retry(build):
                job_log(f"giving up after {build.attempts} attempts")
                s.rollback()
                self._fail(build_id, f"{error} (gave up after {build.attempts} attempts)",
                           job_log)
                return
            job_log(f"retrying in {self.retry.delay(build.attempts):.0f}s")
            build.log = job_log.text()
            self.lease.back_off(build, error[:4000])
            s.commit()
        BUILD_JOBS.labels("retried").inc()


# A stored file: (blob key, sha256, length, its sealing when protected)
Stored = tuple[str, str, int, SealedFile | None]
# A stored compressed copy and its codec
Copy = tuple[Stored, str]


def _set_copy(row: Artifact | CohortArtifact, copy: Copy | None) -> None:
    row.compressed_codec = None if copy is None else copy[1]
    row.compressed_blob_key, row.compressed_sha256, row.compressed_length = (
        (None, None, None) if copy is None else copy[0][:3])


def _plain(done: SealedFile | None) -> tuple[str | None, int | None]:
    return (None, None) if done is None else (done.plain_sha256, done.plain_length)


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Polls `predicate` until true or the deadline (for CLIs and tests)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
