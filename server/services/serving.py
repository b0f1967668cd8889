"""What the device-facing routes read: a channel's current signed manifest, the blob behind an
artifact or patch sha256, signed root versions; and the import of signed roots at start."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from server.blobstore import BlobNotFoundError, BlobStore
from server.blobstore.keys import channel_manifest_key
from server.db import models as db
from server.db.outage import DATABASE_ERRORS, classify
from server.errors import NotFoundError
from server.publish import rootstore
from server.publish.errors import ChannelNotFoundError
from server.publish.keys import KeyPaths, finish_interrupted_rotation
from server.publish.publisher import MANIFEST_MAX_BYTES

log = logging.getLogger("modelfleet.serving")


def current_manifest(factory: sessionmaker[Session], store: BlobStore,
                     channel: str) -> tuple[bytes, str]:
    """(signed bytes, sha256) of the channel's newest manifest (the manifest cache's loader).
    While the database is down: the bucket's copy (`v1/channels/<c>/manifest`, the same
    signed bytes devices may read straight from the bucket), if there is one."""
    try:
        with factory() as session:
            row = session.execute(
                select(db.SignedManifest.blob_key, db.SignedManifest.sha256)
                .join(db.Channel, db.Channel.id == db.SignedManifest.channel_id)
                .where(db.Channel.name == channel)
                .order_by(db.SignedManifest.serial.desc()).limit(1)
            ).first()
    except DATABASE_ERRORS as e:
        if classify(e) is None:
            raise
        return _bucket_manifest(store, channel, e)
    if row is None:
        raise ChannelNotFoundError(f"channel {channel!r} does not exist or has no manifest yet")
    with store.open(row.blob_key) as f:
        data = f.read(MANIFEST_MAX_BYTES + 1)
    return data, str(row.sha256)


def _bucket_manifest(store: BlobStore, channel: str, outage: Exception) -> tuple[bytes, str]:
    try:
        with store.open(channel_manifest_key(channel)) as f:
            data = f.read(MANIFEST_MAX_BYTES + 1)
    except BlobNotFoundError:
        raise outage from None
    log.warning("database unavailable; serving the bucket's manifest of %s", channel)
    return data, hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class BlobRef:
    key: str
    length: int


def blob_ref(session: Session, kind: Literal["artifact", "patch"], sha256: str) -> BlobRef:
    """Where the artifact or patch with this sha256 is stored; NotFoundError if none is."""
    table = db.Artifact if kind == "artifact" else db.Patch
    row = session.execute(select(table.blob_key, table.length)
                          .where(table.sha256 == sha256).limit(1)).first()
    if row is None:  # a watermark cohort's copy, or a patch to one
        cohort = db.CohortArtifact if kind == "artifact" else db.CohortPatch
        row = session.execute(select(cohort.blob_key, cohort.length)
                              .where(cohort.sha256 == sha256).limit(1)).first()
    if row is None and kind == "artifact":  # a compressed copy (manifests/compressed.py)
        for copy in (db.Artifact, db.CohortArtifact):
            found = session.execute(
                select(copy.compressed_blob_key, copy.compressed_length)
                .where(copy.compressed_sha256 == sha256).limit(1)).first()
            if found is not None:
                return BlobRef(str(found[0]), int(found[1] or 0))
    if row is None:
        raise NotFoundError(f"no {kind} with sha256 {sha256}")
    return BlobRef(str(row.blob_key), int(row.length))


def latest_root_version(session: Session) -> int:
    latest = rootstore.latest_root_version(session)
    if latest is None:
        raise NotFoundError("no signed root yet", fix="run `modelfleet keys init --data-dir DIR`")
    return latest


def root_document(session: Session, version: int) -> bytes:
    data = rootstore.root_bytes(session, version)
    if data is None:
        raise NotFoundError(f"no root version {version}")
    return data


def import_roots(factory: sessionmaker[Session], paths: KeyPaths) -> list[int]:
    """Stores the signed roots of DATA_DIR/roots the database lacks; the versions added.
    First completes a key rotation that died halfway (`finish_interrupted_rotation`)."""
    try:
        repaired = finish_interrupted_rotation(paths)
    except OSError as e:  # e.g. a read-only key mount: `modelfleet keys rotate` repairs it
        log.error("an interrupted key rotation could not be repaired here: %s", e)
    else:
        if repaired:
            log.warning("keys: %s", repaired)
    for attempt in (1, 2):
        try:
            with factory() as session:
                added = rootstore.sync_roots(session, paths)
                session.commit()
            break
        except IntegrityError:
            # Workers and replicas start together and import the same roots: another one
            # stored them first. The second pass sees (and checks) what it stored.
            if attempt == 2:
                raise
    if added:
        log.info("imported signed root versions %s", added)
    return added
