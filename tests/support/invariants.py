"""What must hold after any crash, once the restarted server has repaired what it repairs:
`violations(session_factory, store, seen)` lists every broken invariant as a sentence (empty:
all hold). Used by the kill tests (tests/faults/) after each restart; each invariant has a
test that breaks it on purpose and expects it reported (tests/faults/test_invariants.py).

1. Every signed manifest ever served references only blobs that exist (at their read keys,
   with the sha256 the manifest names) — every committed serial and the one served now.
2. A serial never has two contents: each committed serial's stored bytes are the bytes it
   was committed with, the served manifest is one of them, and every (channel, serial) a
   device was ever served (`seen`: sha256 of the bytes) is still that serial's bytes.
3. No version is stuck in a state no worker will move: uploaded/compiling with no build
   to run, patching with no patch job to run, a running job nobody holds.
4. Uploads are whole: every source upload's blob exists with its sha256 (a retried upload
   of the same version thus finds a whole version to answer with), one row per version.
5. What is served is trusted: each channel's served manifest verifies under the newest
   root the server serves (a release-key rotation that died halfway must not leave devices
   that took the new root refusing every manifest).
6. The audit log has every change that took effect and none that did not: each committed
   serial is named by an event of its channel (events of a publishing transaction carry
   its serial), no event names a serial that was never committed; each version has its
   `version.upload` event and each upload event its version; each version with patches
   has a `patches.create` event.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator, Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.blobstore import BlobNotFoundError, BlobStore
from server.blobstore.keys import artifact_key, channel_manifest_key, patch_key
from server.db import models as db

ACTIVE_BUILD = (db.BuildState.queued, db.BuildState.running)
ACTIVE_PATCH_JOB = (db.PatchJobState.queued, db.PatchJobState.running)


def violations(factory: sessionmaker[Session], store: BlobStore,
               seen: Mapping[tuple[str, int], str] | None = None) -> list[str]:
    """Every broken invariant, as a sentence naming what is wrong."""
    blobs = Blobs(store)
    # A live server may publish meanwhile: read what the bucket serves before the rows, so a
    # serial committed after this point is not mistaken for a missing one. The channels'
    # names come from a transaction of their own: the snapshot below must start after the
    # bucket was read (a REPEATABLE READ snapshot starts at its first query).
    with factory() as s:
        names = list(s.scalars(select(db.Channel.name)))
    served = {name: blobs.read(channel_manifest_key(name)) for name in names}
    with factory() as s:
        if s.get_bind().dialect.name == "postgresql":  # one snapshot for every query below
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        return [*manifest_violations(s, blobs, seen or {}, served), *stuck_violations(s),
                *upload_violations(s, blobs), *trust_violations(s, served),
                *audit_violations(s)]


class Blobs:
    """The store's blobs by key, hashed once per check."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._sha: dict[str, str | None] = {}

    def read(self, key: str) -> bytes | None:
        try:
            with self.store.open(key) as f:
                return f.read()
        except BlobNotFoundError:
            return None

    def sha256(self, key: str) -> str | None:
        if key not in self._sha:
            data = self.read(key)
            self._sha[key] = None if data is None else hashlib.sha256(data).hexdigest()
        return self._sha[key]


def manifest_payload(envelope: bytes) -> manifests.Manifest:
    """The manifest inside a signed envelope (parsed, not verified: the SDK's tests verify)."""
    return manifests.Manifest.from_bytes(base64.b64decode(json.loads(envelope)["payload"]))


def blob_references(doc: manifests.Manifest) -> Iterator[tuple[str, str]]:
    """(read key, sha256) of every artifact and patch the manifest offers."""
    for entry in doc.models.values():
        for release in entry.releases:
            for art in release.artifacts:
                yield artifact_key(art.sha256), art.sha256
                for patch in art.patches:
                    yield patch_key(patch.sha256), patch.sha256


def _missing_refs(blobs: Blobs, what: str, envelope: bytes) -> list[str]:
    return [f"{what} references {key}, which {'is missing' if have is None else 'differs'}"
            for key, sha in blob_references(manifest_payload(envelope))
            if (have := blobs.sha256(key)) != sha]


def manifest_violations(s: Session, blobs: Blobs, seen: Mapping[tuple[str, int], str],
                        served: Mapping[str, bytes | None]) -> list[str]:
    out: list[str] = []
    committed: dict[tuple[str, int], str] = {}
    rows = s.execute(select(db.Channel.name, db.SignedManifest)
                     .join(db.SignedManifest, db.SignedManifest.channel_id == db.Channel.id)
                     .order_by(db.Channel.name, db.SignedManifest.serial)).all()
    for channel, row in rows:
        committed[(channel, row.serial)] = row.sha256
        what = f"{channel} serial {row.serial}"
        data = blobs.read(row.blob_key)
        if data is None:
            out.append(f"{what}: its signed bytes {row.blob_key} are missing")
            continue
        if hashlib.sha256(data).hexdigest() != row.sha256:
            out.append(f"{what}: {row.blob_key} no longer holds the bytes it was committed "
                       "with (a serial with two contents)")
            continue
        out += _missing_refs(blobs, what, data)
    for channel, data in sorted(served.items()):
        if data is None:
            continue  # never written yet: nothing was served from the bucket
        serial = manifest_payload(data).serial
        if committed.get((channel, serial)) != hashlib.sha256(data).hexdigest():
            out.append(f"{channel}: the served manifest (serial {serial}) is not the bytes "
                       "committed for that serial")
        out += _missing_refs(blobs, f"{channel}'s served manifest", data)
    for (channel, serial), sha in sorted(seen.items()):
        if (channel, serial) not in committed:
            out.append(f"{channel} serial {serial} was served but never committed")
        elif committed[(channel, serial)] != sha:
            out.append(f"{channel} serial {serial} was served with other bytes than it has "
                       "now (a serial with two contents)")
    return out


def stuck_violations(s: Session) -> list[str]:
    out: list[str] = []
    active_builds = dict(s.execute(
        select(db.Build.version_id, func.count()).where(db.Build.state.in_(ACTIVE_BUILD))
        .group_by(db.Build.version_id)).all())
    active_patches = set(s.scalars(select(db.PatchJob.version_id)
                                   .where(db.PatchJob.state.in_(ACTIVE_PATCH_JOB))))
    for v in s.scalars(select(db.ModelVersion).order_by(db.ModelVersion.id)):
        if v.state in (db.VersionState.uploaded, db.VersionState.compiling) \
                and not active_builds.get(v.id):
            out.append(f"version {v.id} is {v.state.value} with no build queued or running")
        if v.state is db.VersionState.patching and v.id not in active_patches:
            out.append(f"version {v.id} is patching with no patch job queued or running")
    for table, running in ((db.Build, db.BuildState.running),
                           (db.PatchJob, db.PatchJobState.running)):
        for key in s.scalars(select(table.id).where(table.state == running,
                                                    table.locked_by.is_(None))):
            out.append(f"{table.__tablename__} row {key} is running but nobody holds it")
    return out


def upload_violations(s: Session, blobs: Blobs) -> list[str]:
    out: list[str] = []
    for up, protected in s.execute(
            select(db.SourceUpload, db.ModelVersion.protected)
            .join(db.ModelVersion, db.ModelVersion.id == db.SourceUpload.version_id)
            .order_by(db.SourceUpload.id)):
        have = blobs.sha256(up.blob_key)
        if have is None:
            out.append(f"version {up.version_id}'s {up.kind.value} upload {up.blob_key} is "
                       "missing")
        elif not protected and have != up.sha256:  # a protected one rests sealed
            out.append(f"version {up.version_id}'s {up.kind.value} upload {up.blob_key} "
                       "differs from its sha256")
    for model_id, version, n in s.execute(
            select(db.ModelVersion.model_id, db.ModelVersion.version, func.count())
            .group_by(db.ModelVersion.model_id, db.ModelVersion.version)
            .having(func.count() > 1)):
        out.append(f"model {model_id} has {n} rows of version {version}")
    return out


def trust_violations(s: Session, served: Mapping[str, bytes | None]) -> list[str]:
    newest = s.scalars(select(db.RootDocument.data)
                       .order_by(db.RootDocument.version.desc()).limit(1)).first()
    if newest is None:
        return []
    root = manifests.load_trusted_root(newest)
    out = []
    for channel, data in sorted(served.items()):
        if data is None:
            continue
        try:  # expiry aside (a test clock may be anywhere): signatures and shape
            manifests.verify_manifest(root, data, now=0, channel=channel, trusted=None)
        except manifests.ManifestError as e:
            out.append(f"{channel}'s served manifest does not verify under root "
                       f"v{root.version}: {e}")
    return out


def audit_violations(s: Session) -> list[str]:
    # Without one snapshot (SQLite reads each query afresh) a live server may publish between
    # the queries. A publish commits its rows and its events together, so events read BEFORE
    # the rows name only committed rows, and events read AFTER the rows include every event
    # of those rows: each direction is checked against the read that makes it sound.
    def read_events() -> list[db.AuditEvent]:
        return list(s.scalars(select(db.AuditEvent).order_by(db.AuditEvent.id)).all())

    before = read_events()
    committed = set(s.execute(
        select(db.Channel.name, db.SignedManifest.serial)
        .join(db.SignedManifest, db.SignedManifest.channel_id == db.Channel.id)).tuples())
    versions = {f"{m}/{v}": vid for vid, m, v in s.execute(
        select(db.ModelVersion.id, db.Model.name, db.ModelVersion.version)
        .join(db.Model, db.Model.id == db.ModelVersion.model_id))}
    patched = set(s.scalars(select(db.Artifact.version_id).join(
        db.Patch, db.Patch.to_artifact_id == db.Artifact.id)))
    after = read_events()
    out: list[str] = []
    for e in before:
        serial = e.details.get("serial")
        if isinstance(serial, int) and (_event_channel(e.target), serial) not in committed:
            out.append(f"audit event {e.id} ({e.action} {e.target}) names serial {serial}, "
                       "which was never committed")
    audited = {(_event_channel(e.target), e.details["serial"]) for e in after
               if isinstance(e.details.get("serial"), int)}
    for channel, serial in sorted(committed - audited):
        out.append(f"{channel} serial {serial} took effect with no audit event naming it")
    uploads_after = {e.target for e in after if e.action == "version.upload"}
    out += [f"version {t} exists with no version.upload event" for t in sorted(versions)
            if t not in uploads_after]
    out += [f"audit event version.upload {t} names no version" for t in sorted(
        {e.target for e in before if e.action == "version.upload"}) if t not in versions]
    patch_events = {e.target for e in after if e.action == "patches.create"}
    out += [f"version {vid} has patches with no patches.create event" for vid in sorted(patched)
            if f"version:{vid}" not in patch_events]
    return out


def _event_channel(target: str) -> str:
    """The channel of a publishing event's target: `channel:<c>` or `<c>/<model>/<version>`."""
    return target.removeprefix("channel:").split("/", 1)[0]
