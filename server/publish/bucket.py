"""The bucket is the read API: everything a device fetches is written to the blob store under
the API's own paths (server/blobstore/keys.py, `v1/…`) with the content type and cache header
the API answers with, so the bucket itself, a directory behind nginx, or a CDN in front of
either serves a device exactly as the API does. Every byte there is signed (manifests, roots)
or named by its sha256 in a signed manifest (artifacts, patches): whoever serves it need not
be trusted, only kept fresh.

When each path is written:
- `v1/channels/<c>/manifest`: after each publish commits (publisher.update_current); within a
  process the newest serial wins (`ManifestWriter`). `sync_served` — run by the re-sign loop
  every check interval and by `modelfleet bucket sync` — rewrites one that differs from the
  database's newest (a write that failed, or two processes' writes that crossed).
- `v1/root/<n>.json`: when `modelfleet keys init/rotate` stores the root, and by `sync_served`
  (so the API's first loop run writes the roots it imported from DATA_DIR/roots at start).
- `v1/artifacts/<sha>`, `v1/patches/<sha>`: where the build runner and the patch job store
  them. For a row older than that layout (still read through its old key), before a
  manifest offering it is signed, the blob is copied to its `v1/` key and the row pointed
  there (`serve_offered`; a failed copy is logged and retried at the next publish, never
  blocking one); `sync_served(blobs=True)` does it for every row.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Row, Select, func, select, update
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.blobstore import BlobNotFoundError, BlobStore, BlobStoreError
from server.blobstore.interface import Source
from server.blobstore.keys import (
    ARTIFACT_PATTERN,
    CHANNEL_MANIFEST_PATTERN,
    PATCH_PATTERN,
    READ_API_PREFIX,
    ROOT_PATTERN,
    ROOTS_PREFIX,
    artifact_key,
    channel_manifest_key,
    patch_key,
    root_key,
)
from server.db import models as db
from server.publish.httpcache import IMMUTABLE_CACHE_CONTROL
from server.publish.manifest_cache import MANIFEST_CACHE_CONTROL

log = logging.getLogger("modelfleet.publish.bucket")

JSON = "application/json"
OCTETS = "application/octet-stream"


@dataclass(frozen=True)
class ReadPath:
    """One kind of read path: its keys (a whole-key regex) and the headers it is served with."""

    kind: str
    pattern: str
    content_type: str
    cache_control: str


MANIFEST = ReadPath("manifest", CHANNEL_MANIFEST_PATTERN, JSON, MANIFEST_CACHE_CONTROL)
ROOT = ReadPath("root", ROOT_PATTERN, JSON, IMMUTABLE_CACHE_CONTROL)
ARTIFACT = ReadPath("artifact", ARTIFACT_PATTERN, OCTETS, IMMUTABLE_CACHE_CONTROL)
PATCH = ReadPath("patch", PATCH_PATTERN, OCTETS, IMMUTABLE_CACHE_CONTROL)
READ_PATHS = (MANIFEST, ROOT, ARTIFACT, PATCH)


def put_served(store: BlobStore, key: str, path: ReadPath, source: Source, *,
               expected_sha256: str | None = None) -> None:
    store.put(key, source, expected_sha256=expected_sha256, content_type=path.content_type,
              cache_control=path.cache_control)


def store_artifact(store: BlobStore, sha256: str, source: Source) -> str:
    """Stores a built artifact at its read key (checked against `sha256`); returns the key."""
    key = artifact_key(sha256)
    put_served(store, key, ARTIFACT, source, expected_sha256=sha256)
    return key


def store_patch(store: BlobStore, sha256: str, source: Source) -> str:
    key = patch_key(sha256)
    put_served(store, key, PATCH, source, expected_sha256=sha256)
    return key


@dataclass
class ManifestWriter:
    """Writes channels' current manifests, never replacing a newer serial with an older one
    within this process (two publishes of a channel commit in order, but their writes after
    commit may cross)."""

    _written: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, store: BlobStore, channel: str, serial: int, data: bytes) -> bool:
        with self._lock:
            if self._written.get(channel, 0) > serial:
                return False
            put_served(store, channel_manifest_key(channel), MANIFEST, [data])
            self._written[channel] = serial
            return True


def _read_key(path: ReadPath, sha256: str) -> str:
    return artifact_key(sha256) if path is ARTIFACT else patch_key(sha256)


BlobTable = type[db.Artifact] | type[db.Patch]


def _to_read_keys(session: Session, store: BlobStore, path: ReadPath, table: BlobTable,
                  rows: Sequence[Row[int, str, str]], *, tolerant: bool) -> int:
    """Copies each (id, sha256, blob_key) row's blob to its read key unless it is there, then
    points the row at it (same bytes: content-addressed; the old blob is left as it is), so
    the next publish needs no I/O for it. `tolerant`: a failed copy is logged, not raised —
    a publish (a halt) must not wait on the bucket. Returns how many blobs it copied."""
    copied = 0
    for row_id, sha, old in rows:
        key = _read_key(path, sha)
        try:
            if not store.exists(key):
                put_served(store, key, path, store.iter_range(old), expected_sha256=sha)
                copied += 1
                log.info("copied %s to %s for devices reading the bucket", old, key)
        except BlobStoreError:
            if not tolerant:
                raise
            log.exception("could not copy %s to %s: devices reading the bucket cannot fetch "
                          "it until the next publish or `modelfleet bucket sync`", old, key)
            continue
        session.execute(update(table).where(table.id == row_id).values(blob_key=key))
    return copied


def _legacy(table: BlobTable, shas: set[str] | None = None) -> Select[int, str, str]:
    query = select(table.id, table.sha256, table.blob_key).where(
        table.blob_key.not_like(READ_API_PREFIX + "%")).order_by(table.id)
    return query if shas is None else query.where(table.sha256.in_(sorted(shas)))


def serve_offered(session: Session, store: BlobStore, doc: manifests.Manifest) -> int:
    """Before `doc` is signed: every artifact and patch it offers readable at its `v1/` key.
    One query per table, and no blob I/O once every row names its read key."""
    artifacts: set[str] = set()
    patches: set[str] = set()
    for entry in doc.models.values():
        for release in entry.releases:
            for art in release.artifacts:
                artifacts.add(art.sha256)
                patches.update(p.sha256 for p in art.patches)
    copied = 0
    for path, table, shas in ((ARTIFACT, db.Artifact, artifacts), (PATCH, db.Patch, patches)):
        if shas:
            rows = session.execute(_legacy(table, shas)).all()
            copied += _to_read_keys(session, store, path, table, rows, tolerant=True)
    return copied


def write_roots(session: Session, store: BlobStore) -> list[int]:
    """Every signed root version in the database, at its read key; the versions written."""
    present = set(store.list_keys(ROOTS_PREFIX))
    written = []
    for version, data in session.execute(
            select(db.RootDocument.version, db.RootDocument.data)
            .order_by(db.RootDocument.version)):
        if root_key(version) not in present:
            put_served(store, root_key(version), ROOT, [data])
            written.append(version)
    return written


def _served_sha(store: BlobStore, key: str) -> str | None:
    try:
        with store.open(key) as f:
            return hashlib.sha256(f.read(manifests.MANIFEST_MAX_SIZE + 1)).hexdigest()
    except BlobNotFoundError:
        return None


def sync_manifests(session: Session, store: BlobStore, writer: ManifestWriter) -> list[str]:
    """Rewrites each channel's served manifest that is not the database's newest; returns
    the channels rewritten."""
    newest = (select(db.SignedManifest.channel_id, func.max(db.SignedManifest.serial)
                     .label("serial")).group_by(db.SignedManifest.channel_id).subquery())
    rows = session.execute(
        select(db.Channel.name, db.SignedManifest.serial, db.SignedManifest.sha256,
               db.SignedManifest.blob_key)
        .join(newest, newest.c.channel_id == db.Channel.id)
        .join(db.SignedManifest, (db.SignedManifest.channel_id == db.Channel.id)
              & (db.SignedManifest.serial == newest.c.serial))
        .order_by(db.Channel.name)).all()
    rewritten = []
    for name, serial, sha, key in rows:
        if _served_sha(store, channel_manifest_key(name)) == sha:
            continue
        with store.open(key) as f:
            data = f.read(manifests.MANIFEST_MAX_SIZE + 1)
        if writer.write(store, name, serial, data):
            rewritten.append(name)
    return rewritten


@dataclass(frozen=True)
class SyncReport:
    roots: list[int]
    channels: list[str]
    artifacts: int = 0
    patches: int = 0


def sync_served(factory: sessionmaker[Session], store: BlobStore, writer: ManifestWriter,
                *, blobs: bool = False) -> SyncReport:
    """Brings the bucket's read paths level with the database: missing roots, stale current
    manifests and (with `blobs`, the backfill of `modelfleet bucket sync`) every artifact
    and patch stored under an older key. Idempotent."""
    with factory() as session:
        roots = write_roots(session, store)
        channels = sync_manifests(session, store, writer)
        counts = {ARTIFACT.kind: 0, PATCH.kind: 0}
        if blobs:
            for path, table in ((ARTIFACT, db.Artifact), (PATCH, db.Patch)):
                rows = session.execute(_legacy(table)).all()
                counts[path.kind] = _to_read_keys(session, store, path, table, rows,
                                                  tolerant=False)
                session.commit()  # per table: an interrupted backfill keeps what it did
    if roots or channels:
        log.info("bucket: wrote roots %s, rewrote the manifests of %s", roots, channels)
    return SyncReport(roots, channels, counts[ARTIFACT.kind], counts[PATCH.kind])


__all__ = ["READ_API_PREFIX", "READ_PATHS", "ManifestWriter", "ReadPath", "SyncReport",
           "serve_offered", "store_artifact", "store_patch", "sync_served", "write_roots"]
