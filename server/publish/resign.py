"""Re-signing before expiry: a manifest nobody changed still gets a fresh `expires` (and a new
serial) well before devices would freeze on an expired one.

`resign_due` is the whole decision, driven by the publisher's clock (tests inject one);
`resign_loop` runs it periodically inside the API process, each time followed by the bucket's
`sync_served` (server/publish/bucket.py: roots imported at start, a current manifest whose
write failed or crossed another process's). Each channel is re-signed on its
own: a channel that cannot be signed (a corrupt row, a manifest over the size cap) is logged
and audited as `manifest.resign_failed`, and the channels after it are still re-signed — one
bad channel must not let every other channel expire on devices. Several API replicas may all run
the loop: the channel lock plus the re-check inside it make the second one a no-op.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.blobstore import BlobStore, BlobStoreError
from server.db import audit
from server.db import models as db
from server.publish.bucket import sync_served
from server.publish.errors import KeyStoreError
from server.publish.publisher import (
    MANIFEST_MAX_BYTES,
    Audited,
    PublishedManifest,
    Publisher,
    latest_manifest,
    publish_change,
)

log = logging.getLogger("modelfleet.publish.resign")

FAILED_ACTION = "manifest.resign_failed"
MAX_ERROR_CHARS = 2000


def resign_margin(lifetime_seconds: int) -> int:
    """Re-sign once less than half the lifetime remains: a missed run or two is harmless."""
    return lifetime_seconds // 2


def check_interval(lifetime_seconds: int) -> float:
    return float(max(1, min(60, lifetime_seconds // 10)))


def channels_due(session: Session, now: int, margin: int) -> list[str]:
    """Channels whose newest manifest expires within `margin` seconds (or has none)."""
    newest = (
        select(db.SignedManifest.channel_id, func.max(db.SignedManifest.expires).label("exp"))
        .group_by(db.SignedManifest.channel_id).subquery()
    )
    rows = session.execute(
        select(db.Channel.name, newest.c.exp)
        .outerjoin(newest, newest.c.channel_id == db.Channel.id).order_by(db.Channel.name)
    ).all()
    return [name for name, exp in rows if exp is None or exp - now <= margin]


def channels_signed_by_other_keys(session: Session, store: BlobStore, keyid: str) -> list[str]:
    """Channels whose newest manifest carries no signature by `keyid` (the release key now):
    a release-key rotation that died before re-signing them all, or a key replaced by hand.
    Devices that moved to the root naming the new key refuse those manifests."""
    out = []
    for name, blob_key in session.execute(
            select(db.Channel.name, db.SignedManifest.blob_key)
            .join(db.SignedManifest, db.SignedManifest.channel_id == db.Channel.id)
            .where(db.SignedManifest.serial == select(func.max(db.SignedManifest.serial))
                   .where(db.SignedManifest.channel_id == db.Channel.id)
                   .correlate(db.Channel).scalar_subquery())
            .order_by(db.Channel.name)):
        try:
            with store.open(blob_key) as f:
                envelope = manifests.Envelope.from_bytes(f.read(MANIFEST_MAX_BYTES + 1),
                                                         MANIFEST_MAX_BYTES)
        except (BlobStoreError, manifests.ManifestError):
            log.exception("cannot read channel %r's newest manifest %s", name, blob_key)
            continue
        if all(sig.keyid != keyid for sig in envelope.signatures):
            out.append(name)
    return out


def resign_due(factory: sessionmaker[Session], pub: Publisher, *,
               margin: int | None = None) -> list[PublishedManifest]:
    """Re-sign every channel that is due, or whose newest manifest another key signed;
    returns what was published."""
    margin = resign_margin(pub.lifetime_seconds) if margin is None else margin
    now = pub.clock()
    with factory() as session:
        due = channels_due(session, now, margin)
        rekey = set(channels_signed_by_other_keys(session, pub.blob_store, pub.signer.keyid()))
    out: list[PublishedManifest] = []
    for name in sorted(set(due) | rekey):
        try:
            published = _resign_one(factory, pub, name, now, margin if name not in rekey
                                    else None)
        except Exception as e:  # isolate: the next channel must still be re-signed
            log.exception("re-signing channel %r failed; continuing with the others", name)
            _record_failure(factory, name, e)
            continue
        if published is not None:
            log.info("re-signed %s as serial %d", name, published.serial)
            out.append(published)
    return out


def _resign_one(factory: sessionmaker[Session], pub: Publisher, name: str, now: int,
                margin: int | None) -> PublishedManifest | None:
    """Re-sign `name` if still due (`margin`), or unconditionally (None: a re-key, which a
    concurrent replica's re-key only makes happen twice, harmlessly)."""
    def change(session: Session, ch: db.Channel) -> Audited:
        latest = latest_manifest(session, ch.id)
        action = "manifest.resign" if margin is not None else "manifest.rekey"
        if margin is not None and latest is not None and latest.expires - now > margin:
            return Audited(action, ch.name, {}, publish=False)  # someone did
        audit.record(session, "system", action, f"channel:{ch.name}",
                     previous_expires=None if latest is None else latest.expires)
        return Audited(action, ch.name, {})

    _, published = publish_change(factory, pub, name, change)
    return published


def _record_failure(factory: sessionmaker[Session], name: str, error: Exception) -> None:
    """Audit a failed re-sign once per distinct error (the loop retries every interval)."""
    message = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
    target = f"channel:{name}"[:255]
    try:
        with factory() as session:
            last = session.scalars(
                select(db.AuditEvent).where(db.AuditEvent.target == target)
                .order_by(db.AuditEvent.id.desc()).limit(1)
            ).first()
            repeated = (last is not None and last.action == FAILED_ACTION
                        and last.details.get("error") == message)
            if repeated:
                return
            audit.record(session, "system", FAILED_ACTION, target, error=message)
            session.commit()
    except Exception:  # the database itself may be what failed; the log line stands
        log.exception("could not audit the failed re-sign of %r", name)


async def resign_loop(factory: sessionmaker[Session], pub: Publisher) -> None:
    """Run `resign_due` forever (until cancelled), logging and surviving failures."""
    interval = check_interval(pub.lifetime_seconds)
    while True:
        try:
            await asyncio.to_thread(resign_due, factory, pub)
        except KeyStoreError as e:
            # A setup error whose message says the fix: one line, not a traceback per
            # interval (formatting one also runs ast.parse, which CPython 3.11.7 does not
            # make safe against another thread's ast.parse, such as an import under pytest).
            log.error("re-signing failed: %s; retrying in %.0f s", e, interval)
        except Exception:  # keep trying: an outage must not end re-signing for good
            log.exception("re-signing failed; retrying in %.0f s", interval)
        try:
            await asyncio.to_thread(sync_served, factory, pub.blob_store, pub.current)
        except Exception:  # the API still serves devices; the bucket is retried next time
            log.exception("bringing the bucket's read paths up to date failed; retrying in "
                          "%.0f s", interval)
        await asyncio.sleep(interval)
