"""Publishing a channel: build the manifest from the database, sign it with the release key,
store the exact signed bytes in the blob store and record the next serial.

Serial safety: every publish of a channel runs in one transaction that first locks the
channel's row (SELECT … FOR UPDATE on PostgreSQL), so concurrent rollout changes queue up; the
unique (channel_id, serial) constraint is the backstop (SQLite has no row locks) and a lost race
is retried from scratch in a fresh transaction. A serial is therefore never signed twice with
different contents as far as anyone can observe: the per-serial blob is written before commit
but only referenced after commit, and the channel's "current" blob is replaced after commit.

Blob keys: manifests/<channel>/<serial>.json (every serial, private) and the read path
v1/channels/<channel>/manifest (the current one, served to devices by the bucket, nginx or a
CDN as by the API: server/publish/bucket.py). Before signing, every artifact and patch the
manifest offers is made readable at its v1/ key, so the bucket never names a file it lacks.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

import manifests
from manifests.manifest import Mode
from server import crashpoints
from server.blobstore import BlobStore
from server.blobstore.keys import artifact_key, channel_manifest_key, manifest_key, patch_key
from server.db import audit
from server.db import models as db
from server.db.outage import is_transient_conflict
from server.publish import records
from server.publish.bucket import ManifestWriter, serve_offered
from server.publish.builder import build_manifest, join_url
from server.publish.errors import (
    ChannelNotFoundError,
    ManifestTooLargeError,
    SerialConflictError,
)
from server.publish.protection import ContentKeys
from server.publish.signer import Signer, sign_envelope

log = logging.getLogger("modelfleet.publish")

T = TypeVar("T")
MANIFEST_MAX_BYTES = manifests.MANIFEST_MAX_SIZE
PUBLISH_ATTEMPTS = 8


def artifact_path(sha256: str) -> str:
    """The artifact's URL path under the server's base URL: its read key in the bucket too."""
    return artifact_key(sha256)


def patch_path(sha256: str) -> str:
    return patch_key(sha256)


@dataclass
class Publisher:
    """What publishing needs besides a session: store, key, clock, URLs, lifetime."""

    blob_store: BlobStore
    signer: Signer  # the release key; the only way this module signs
    base_url: str
    lifetime_seconds: int
    clock: Callable[[], int]  # Unix seconds (server/wiring.py: the wall clock)
    # Protected versions' content keys (server/publish/protection.py); None: none can be.
    content_keys: ContentKeys | None
    # Called after each publish committed (the "published" event): the manifest cache drops
    # the channel's entry here, wherever the publish came from (route, patch job, re-sign).
    subscribers: list[Callable[[PublishedManifest], None]] = field(default_factory=list)
    # Writes v1/channels/<c>/manifest after commit, the newest serial winning in-process.
    current: ManifestWriter = field(default_factory=ManifestWriter)

    def subscribe(self, callback: Callable[[PublishedManifest], None]) -> None:
        self.subscribers.append(callback)

    def announce(self, published: PublishedManifest) -> None:
        for callback in self.subscribers:
            try:
                callback(published)
            except Exception:  # the publish is committed; one subscriber must not undo it
                log.exception("a subscriber of channel %s's publish failed", published.channel)


@dataclass(frozen=True)
class PublishedManifest:
    channel: str
    serial: int
    sha256: str
    length: int
    expires: int
    blob_key: str
    data: bytes = field(repr=False, compare=False)  # the signed bytes, written as they are


def load_rollout_records(session: Session, channel_id: int, base_url: str
                         ) -> list[records.RolloutRecord]:
    """Every release on the channel as plain records, with artifacts and their patches."""
    rows = session.execute(
        select(db.Release, db.ModelVersion, db.Model)
        .join(db.ModelVersion, db.Release.version_id == db.ModelVersion.id)
        .join(db.Model, db.ModelVersion.model_id == db.Model.id)
        .where(db.Release.channel_id == channel_id)
        .order_by(db.Release.id)
    ).all()
    out = []
    for release, version, model in rows:
        if release.state is db.ReleaseState.halted:
            artifacts: tuple[manifests.Artifact, ...] = ()  # never offered; skip the reads
        else:
            artifacts = load_artifact_records(session, version.id, base_url)
        out.append(release_record(release, model.name, version.version, artifacts))
    return out


def release_record(release: db.Release, model: str, version: str,
                   artifacts: tuple[manifests.Artifact, ...] = ()) -> records.RolloutRecord:
    shadow = None
    if release.shadow_max_kl_micro is not None:
        shadow = manifests.ShadowThresholds(
            max_kl_micro=release.shadow_max_kl_micro,
            max_latency_p99_us=release.shadow_max_latency_p99_us or 0,
            min_samples=release.shadow_min_samples or 0,
        )
    mode: Mode = "shadow" if release.mode is db.RolloutMode.shadow else "active"
    return records.RolloutRecord(
        id=release.id, seq=release.id, model=model, version=version,
        share_ppm=release.share_ppm, salt=release.salt, mode=mode, state=release.state,
        filters=records.filters_from_columns(release.filters, release.pinned_devices,
                                             release.denied_devices),
        shadow=shadow, artifacts=artifacts,
        failed_platforms=tuple(release.failed_platforms or ()),
    )


def load_artifact_records(session: Session, version_id: int, base_url: str
                          ) -> tuple[manifests.Artifact, ...]:
    """The version's artifacts as the manifest offers them (URLs under `base_url`), each with
    its patches, smallest first."""
    arts = session.scalars(
        select(db.Artifact).where(db.Artifact.version_id == version_id)
        .order_by(db.Artifact.platform, db.Artifact.variant)
    ).all()
    out = []
    for a in arts:
        patch_rows = session.execute(
            select(db.Patch, db.Artifact.sha256)
            .join(db.Artifact, db.Patch.from_artifact_id == db.Artifact.id)
            .where(db.Patch.to_artifact_id == a.id)
            .order_by(db.Patch.length)  # smallest first: the SDK takes the first that applies
        ).all()
        patches = [
            manifests.Patch(from_sha256=from_sha, url=join_url(base_url, patch_path(p.sha256)),
                            length=p.length, sha256=p.sha256, algorithm=p.algorithm)
            for p, from_sha in patch_rows
        ]
        out.append(manifests.Artifact(
            platform=a.platform, variant=a.variant, format=a.format,
            url=join_url(base_url, artifact_path(a.sha256)), length=a.length, sha256=a.sha256,
            compile_settings={k: v for k, v in (a.compile_settings or {}).items()
                              if isinstance(v, str | int | bool)},
            target={k: str(v) for k, v in (a.target or {}).items()},
            patches=patches, sealed=_sealed(a.plain_sha256, a.plain_length),
            requires=requires_of(a), cohorts=_cohorts(session, a, base_url),
            compressed=_compressed(a, base_url),
        ))
    return tuple(out)


# What an HTP artifact's precision needs of the hardware (manifests/capabilities.py).
_HTP_REQUIRES = {"fp16": [manifests.capabilities.HTP_FP16],
                 "int8": [manifests.capabilities.HTP_INT8]}


def requires_of(a: db.Artifact) -> list[str]:
    """The capabilities a device needs for artifact `a`: a QNN build's precision."""
    if a.platform != "qnn":
        return []
    return list(_HTP_REQUIRES.get(str((a.compile_settings or {}).get("precision", "")), []))


def _sealed(plain_sha256: str | None, plain_length: int | None) -> manifests.Sealed | None:
    return None if plain_sha256 is None else manifests.Sealed(
        plain_sha256=plain_sha256, plain_length=int(plain_length or 0))


def _compressed(row: db.Artifact | db.CohortArtifact, base_url: str
                ) -> manifests.Compressed | None:
    """The row's compressed copy, served content-addressed like artifacts."""
    if row.compressed_sha256 is None or row.compressed_codec is None:
        return None
    return manifests.Compressed(codec=row.compressed_codec,
                                url=join_url(base_url, artifact_path(row.compressed_sha256)),
                                length=int(row.compressed_length or 0),
                                sha256=row.compressed_sha256)


def _cohorts(session: Session, a: db.Artifact, base_url: str) -> manifests.Cohorts | None:
    """A watermarked artifact's per-cohort copies; the salt is the model's name, so a device
    stays in one cohort across the model's versions."""
    if not a.cohorts:
        return None
    model = session.scalar(select(db.Model.name).join(
        db.ModelVersion, db.ModelVersion.model_id == db.Model.id)
        .where(db.ModelVersion.id == a.version_id))
    return manifests.Cohorts(salt=str(model), artifacts=[manifests.CohortArtifact(
        url=join_url(base_url, artifact_path(c.sha256)), length=c.length, sha256=c.sha256,
        sealed=_sealed(c.plain_sha256, c.plain_length), compressed=_compressed(c, base_url),
        patches=[
            manifests.Patch(from_sha256=p.from_sha256, url=join_url(base_url,
                            patch_path(p.sha256)), length=p.length, sha256=p.sha256,
                            algorithm=p.algorithm)
            for p in session.scalars(select(db.CohortPatch)
                                     .where(db.CohortPatch.to_cohort_artifact_id == c.id)
                                     .order_by(db.CohortPatch.length))])
        for c in a.cohorts])


def find_locked_channel(session: Session, name: str) -> db.Channel | None:
    """The channel row, locked for the rest of the transaction (a no-op lock on SQLite)."""
    return session.scalars(
        select(db.Channel).where(db.Channel.name == name).with_for_update()
    ).first()


def lock_channel(session: Session, name: str) -> db.Channel:
    """`find_locked_channel`, or ChannelNotFoundError."""
    channel = find_locked_channel(session, name)
    if channel is None:
        raise ChannelNotFoundError(
            f"no channel named {name!r}",
            fix="create it with POST /v1/channels {\"name\": ...} (scope rollout)",
        )
    return channel


def latest_manifest(session: Session, channel_id: int) -> db.SignedManifest | None:
    return session.scalars(
        select(db.SignedManifest).where(db.SignedManifest.channel_id == channel_id)
        .order_by(db.SignedManifest.serial.desc()).limit(1)
    ).first()


def sign_and_store(session: Session, pub: Publisher, channel: db.Channel) -> PublishedManifest:
    """Inside the caller's transaction (channel row locked): next serial, build, sign, store."""
    serial = (session.scalar(
        select(func.max(db.SignedManifest.serial))
        .where(db.SignedManifest.channel_id == channel.id)
    ) or 0) + 1
    expires = pub.clock() + pub.lifetime_seconds
    doc = build_manifest(channel=channel.name, serial=serial, expires=expires,
                         rollouts=load_rollout_records(session, channel.id, pub.base_url))
    serve_offered(session, pub.blob_store, doc)
    signed = sign_envelope(doc.to_bytes(), manifests.MANIFEST_PAYLOAD_TYPE, [pub.signer])
    if len(signed) > MANIFEST_MAX_BYTES:
        raise ManifestTooLargeError(
            f"the signed manifest of {channel.name!r} would be {len(signed)} bytes, over the "
            f"{MANIFEST_MAX_BYTES}-byte cap devices enforce",
            fix="bring in-flight rollouts to 100% or halt them, or shorten pin lists",
        )
    key = manifest_key(channel.name, serial)
    info = pub.blob_store.put(key, [signed], content_type="application/json")
    crashpoints.reached("publish.signed")
    sha = hashlib.sha256(signed).hexdigest()
    session.add(db.SignedManifest(channel_id=channel.id, serial=serial, blob_key=key,
                                  sha256=sha, length=info.length, expires=expires))
    audit.stamp_serial(session, serial)
    session.flush()  # the unique (channel_id, serial) constraint fires here, not at commit
    return PublishedManifest(channel.name, serial, sha, info.length, expires, key, signed)


def publish_change(
    factory: sessionmaker[Session], pub: Publisher, channel: str,
    change: Callable[[Session, db.Channel], T], *, attempts: int = PUBLISH_ATTEMPTS,
    open_channel: Callable[[Session, str], db.Channel] = lock_channel,
) -> tuple[T, PublishedManifest | None]:
    """Apply `change` and publish the resulting manifest atomically, retrying lost races:
    one change, one signed serial.

    `open_channel` finds the channel's row and locks it (or, for a rollout that creates its
    channel, adds it in the same transaction: a concurrent creator's row makes the flush
    fail, and the retry finds that row). `change` runs inside the locked transaction and may
    be re-run on a retry; it returns a result, and publishing is skipped when it returns an
    object with `publish = False` (a no-op change such as halting an already halted
    rollout).
    """
    last: Exception | None = None
    for attempt in range(attempts):
        with factory() as session:
            try:
                row = open_channel(session, channel)
                result = change(session, row)
                published = None
                if getattr(result, "publish", True):
                    published = sign_and_store(session, pub, row)
                session.commit()
            except (IntegrityError, OperationalError) as e:
                if isinstance(e, OperationalError) and not is_transient_conflict(e):
                    raise  # the database is down: a 503 (server/db/outage.py), not a race
                # A concurrent publisher took this serial (or SQLite was busy): start over.
                session.rollback()
                last = e
                time.sleep(0.005 * (attempt + 1))
                continue
        if published is not None:
            crashpoints.reached("publish.committed")
            update_current(pub, published)
        return result, published
    raise SerialConflictError(
        f"could not publish channel {channel!r} after {attempts} attempts: {last}",
        fix="retry the request; if it keeps failing, check the database",
    )


def update_current(pub: Publisher, published: PublishedManifest) -> None:
    """After commit (so it never runs ahead): write the new bytes to
    v1/channels/<channel>/manifest, then announce the publish to the publisher's subscribers
    (the manifest cache)."""
    try:  # the bytes just signed, from memory: never read back from the store
        pub.current.write(pub.blob_store, published.channel, published.serial, published.data)
    except Exception:  # the DB is the source of truth; the re-sign loop's sync repairs it
        log.exception("could not update %s", channel_manifest_key(published.channel))
    crashpoints.reached("publish.served")
    pub.announce(published)


@dataclass(frozen=True)
class Audited:
    """A change's result: what to audit, and whether to publish."""

    action: str
    target: str
    details: dict[str, object]
    publish: bool = True
    rollout_id: int | None = None


def publish_channel(factory: sessionmaker[Session], pub: Publisher, channel: str, *,
                    actor: str, action: str = "manifest.publish") -> PublishedManifest:
    """Re-publish `channel` as it stands (new serial, fresh expiry)."""

    def change(session: Session, row: db.Channel) -> Audited:
        audit.record(session, actor, action, f"channel:{row.name}")
        return Audited(action, row.name, {})

    _, published = publish_change(factory, pub, channel, change)
    assert published is not None
    return published
